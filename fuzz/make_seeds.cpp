// Writes small valid GGUF files into a folder, as a seed corpus for
// fuzz_gguf: every value type, nested arrays, several tensor types and
// alignments. Usage: fuzz_gguf_seeds DIR
#include <cstdio>
#include <string>
#include <vector>

#include "encore/gguf.h"

using namespace encore;
using namespace encore::gguf;

namespace {

Value scalar(ValueType t, uint64_t u, int64_t i, double f) {
  Value v;
  v.type = t;
  v.u = u;
  v.i = i;
  v.f = f;
  return v;
}

std::vector<uint8_t> pattern(uint64_t n) {
  std::vector<uint8_t> b(n);
  for (uint64_t k = 0; k < n; ++k) b[k] = static_cast<uint8_t>(k * 31 + 7);
  return b;
}

void add_tensor(Writer& w, const std::string& name, DType type, std::vector<uint64_t> dims) {
  const DTypeInfo& info = dtype_info(type);
  uint64_t n = dims[0] / info.block_elems * info.block_bytes;
  for (size_t d = 1; d < dims.size(); ++d) n *= dims[d];
  w.add_tensor(name, type, std::move(dims), pattern(n));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    Writer empty;
    empty.write(dir + "/empty.gguf");

    Writer values;
    values.set("general.architecture", Value::make_string("llama"));
    values.set("a.u8", scalar(ValueType::UINT8, 200, 0, 0));
    values.set("a.i8", scalar(ValueType::INT8, 0, -5, 0));
    values.set("a.u16", scalar(ValueType::UINT16, 60000, 0, 0));
    values.set("a.i16", scalar(ValueType::INT16, 0, -300, 0));
    values.set("llama.block_count", Value::make_u32(5));
    values.set("a.i32", Value::make_i32(-70000));
    values.set("a.f32", Value::make_f32(1e-5f));
    values.set("a.bool", Value::make_bool(true));
    values.set("a.u64", Value::make_u64(1ull << 40));
    values.set("a.i64", scalar(ValueType::INT64, 0, -(1ll << 40), 0));
    values.set("a.f64", scalar(ValueType::FLOAT64, 0, 0, 0.125));
    values.set("tokenizer.ggml.tokens",
               Value::make_array(ValueType::STRING,
                                 {Value::make_string("<s>"), Value::make_string("hello")}));
    values.set("tokenizer.ggml.scores",
               Value::make_array(ValueType::FLOAT32, {Value::make_f32(0), Value::make_f32(-1)}));
    values.set("a.nested",
               Value::make_array(ValueType::ARRAY,
                                 {Value::make_array(ValueType::INT32, {Value::make_i32(1)}),
                                  Value::make_array(ValueType::BOOL, {})}));
    values.write(dir + "/values.gguf");

    Writer tensors;
    tensors.set("general.architecture", Value::make_string("llama"));
    add_tensor(tensors, "token_embd.weight", DType::F32, {8, 4});
    add_tensor(tensors, "blk.0.attn_q.weight", DType::F16, {8, 8});
    add_tensor(tensors, "blk.0.ffn_up.weight", DType::Q8_0, {32, 2});
    add_tensor(tensors, "blk.0.ffn_down.weight", DType::Q4_K, {256, 1});
    add_tensor(tensors, "output_norm.weight", DType::BF16, {8});
    add_tensor(tensors, "x.4d", DType::I8, {2, 2, 2, 2});
    tensors.write(dir + "/tensors.gguf");

    Writer aligned(64);
    aligned.set("general.name", Value::make_string("aligned"));
    add_tensor(aligned, "a", DType::Q4_0, {32});
    add_tensor(aligned, "b", DType::F32, {3});
    aligned.write(dir + "/aligned64.gguf");
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
