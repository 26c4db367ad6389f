// Tensor element types, numbered exactly as GGUF/ggml number them.
//
// Block-quantised types store `block_elems` values in `block_bytes` bytes;
// a row of n values of such a type needs n % block_elems == 0.
// Thread-safety: everything here is immutable data and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace encore {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  // 4 and 5 (Q4_2, Q4_3) were removed from ggml long ago.
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
};

struct DTypeInfo {
  DType type;
  const char* name;      // as ggml prints it: "F32", "Q4_K", ...
  uint32_t block_elems;  // values per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
  bool can_dequantize;   // Encore can turn it into floats
};

// Traits of a raw type id read from a file; nullptr if the id is unknown.
const DTypeInfo* dtype_info(uint32_t raw_type);
// Traits of a known type (never null).
const DTypeInfo& dtype_info(DType type);
const char* dtype_name(DType type);
// Case-insensitive name lookup ("q8_0", "F16" ...); nullopt if unknown.
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of a row of n values. Requires n % block_elems == 0 (checked by
// callers that handle untrusted input; asserted here).
uint64_t dtype_row_bytes(DType type, uint64_t n);

}  // namespace encore
