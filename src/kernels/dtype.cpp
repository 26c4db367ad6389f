// Type traits for the GGUF/ggml tensor types (see include/encore/dtype.h).
#include "encore/dtype.h"

#include <array>
#include <cassert>
#include <cctype>

namespace encore {
namespace {

// Sizes as defined by ggml's block formats. `can_dequantize` marks the types
// this build can turn into floats; the others can be read (their sizes are
// known, so a file holding them still validates) but not computed with.
constexpr DTypeInfo kTypes[] = {
    {DType::F32, "F32", 1, 4, true},
    {DType::F16, "F16", 1, 2, true},
    {DType::Q4_0, "Q4_0", 32, 18, true},
    {DType::Q4_1, "Q4_1", 32, 20, true},
    {DType::Q5_0, "Q5_0", 32, 22, true},
    {DType::Q5_1, "Q5_1", 32, 24, true},
    {DType::Q8_0, "Q8_0", 32, 34, true},
    {DType::Q8_1, "Q8_1", 32, 36, false},
    {DType::Q2_K, "Q2_K", 256, 84, false},
    {DType::Q3_K, "Q3_K", 256, 110, false},
    {DType::Q4_K, "Q4_K", 256, 144, true},
    {DType::Q5_K, "Q5_K", 256, 176, true},
    {DType::Q6_K, "Q6_K", 256, 210, true},
    {DType::Q8_K, "Q8_K", 256, 292, false},
    {DType::IQ2_XXS, "IQ2_XXS", 256, 66, false},
    {DType::IQ2_XS, "IQ2_XS", 256, 74, false},
    {DType::IQ3_XXS, "IQ3_XXS", 256, 98, false},
    {DType::IQ1_S, "IQ1_S", 256, 50, false},
    {DType::IQ4_NL, "IQ4_NL", 32, 18, false},
    {DType::IQ3_S, "IQ3_S", 256, 110, false},
    {DType::IQ2_S, "IQ2_S", 256, 82, false},
    {DType::IQ4_XS, "IQ4_XS", 256, 136, false},
    {DType::I8, "I8", 1, 1, false},
    {DType::I16, "I16", 1, 2, false},
    {DType::I32, "I32", 1, 4, false},
    {DType::I64, "I64", 1, 8, false},
    {DType::F64, "F64", 1, 8, false},
    {DType::IQ1_M, "IQ1_M", 256, 56, false},
    {DType::BF16, "BF16", 1, 2, true},
    {DType::TQ1_0, "TQ1_0", 256, 54, false},
    {DType::TQ2_0, "TQ2_0", 256, 66, false},
};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::toupper(static_cast<unsigned char>(a[i])) !=
        std::toupper(static_cast<unsigned char>(b[i])))
      return false;
  }
  return true;
}

}  // namespace

const DTypeInfo* dtype_info(uint32_t raw_type) {
  for (const DTypeInfo& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == raw_type) return &t;
  }
  return nullptr;
}

const DTypeInfo& dtype_info(DType type) {
  const DTypeInfo* info = dtype_info(static_cast<uint32_t>(type));
  assert(info != nullptr && "DType value outside the enum");
  return *info;
}

const char* dtype_name(DType type) { return dtype_info(type).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeInfo& t : kTypes) {
    if (iequals(name, t.name)) return t.type;
  }
  return std::nullopt;
}

uint64_t dtype_row_bytes(DType type, uint64_t n) {
  const DTypeInfo& info = dtype_info(type);
  assert(n % info.block_elems == 0);
  return n / info.block_elems * info.block_bytes;
}

}  // namespace encore
