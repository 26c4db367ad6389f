// libFuzzer target for the GGUF reader. Any input must either parse or throw
// GgufError; anything else (crash, sanitizer report, other exception, OOM)
// is a bug. Accepted inputs are also checked end to end: every byte and value
// is touched, the typed getters run on every key, and the file is rewritten
// with the Writer and parsed again, which must give the same content.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "encore/fingerprint.h"
#include "encore/gguf.h"
#include "encore/thread_pool.h"

namespace {

using encore::GgufError;
using namespace encore::gguf;

uint64_t touch(const Value& v) {
  uint64_t acc = v.u ^ static_cast<uint64_t>(v.i) ^ static_cast<uint64_t>(v.f != 0.0) ^ v.s.size();
  for (const Value& item : v.arr) acc += touch(item);
  return acc;
}

template <typename F>
void expect_gguf_error_or_value(F&& f) {
  try {
    f();
  } catch (const GgufError&) {
  }
}

void check(bool ok) {
  if (!ok) std::abort();
}

void round_trip(const File& f) {
  Writer w;  // set("general.alignment") below carries a non-default alignment over
  for (const KeyValue& kv : f.metadata()) w.set(kv.key, kv.value);
  for (const TensorInfo& t : f.tensors()) {
    w.add_tensor(t.name, t.type, t.dims, std::vector<uint8_t>(t.data, t.data + t.n_bytes));
  }
  File g = File::from_bytes(w.to_bytes(), "rewritten.gguf");
  check(g.alignment() == f.alignment());
  check(g.metadata().size() == f.metadata().size());
  for (size_t k = 0; k < f.metadata().size(); ++k) {
    check(g.metadata()[k].key == f.metadata()[k].key);
    check(g.metadata()[k].value == f.metadata()[k].value);
  }
  check(g.tensors().size() == f.tensors().size());
  for (size_t k = 0; k < f.tensors().size(); ++k) {
    const TensorInfo& a = f.tensors()[k];
    const TensorInfo& b = g.tensors()[k];
    check(a.name == b.name && a.type == b.type && a.dims == b.dims && a.n_bytes == b.n_bytes);
    check(std::memcmp(a.data, b.data, a.n_bytes) == 0);
  }
  // Pools live for the whole run: starting threads per input would dominate.
  static encore::ThreadPool one(1);
  static encore::ThreadPool two(2);
  check(encore::model_fingerprint(f, one) == encore::model_fingerprint(g, two));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::optional<File> parsed;
  try {
    parsed.emplace(File::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf"));
  } catch (const GgufError&) {
    return 0;  // rejected cleanly: the expected outcome for most inputs
  }
  const File& f = *parsed;

  volatile uint64_t sink = 0;
  for (const TensorInfo& t : f.tensors()) {
    for (uint8_t b : t.bytes()) sink = sink + b;
    sink = sink + t.n_rows() + t.n_elements;
    check(f.find_tensor(t.name) == &t);
  }
  for (const KeyValue& kv : f.metadata()) {
    sink = sink + touch(kv.value) + kv.value.to_string(4).size();
    check(f.find(kv.key) == &kv.value);
    expect_gguf_error_or_value([&] { sink = sink + f.get_u32(kv.key); });
    expect_gguf_error_or_value([&] { sink = sink + f.get_u64(kv.key); });
    expect_gguf_error_or_value([&] { sink = sink + static_cast<uint64_t>(f.get_i64(kv.key)); });
    expect_gguf_error_or_value([&] { sink = sink + (f.get_f32(kv.key) != 0.0f); });
    expect_gguf_error_or_value([&] { sink = sink + f.get_bool(kv.key); });
    expect_gguf_error_or_value([&] { sink = sink + f.get_string(kv.key).size(); });
    expect_gguf_error_or_value([&] { sink = sink + f.get_array(kv.key).arr.size(); });
    expect_gguf_error_or_value([&] { sink = sink + f.opt_u32(kv.key).value_or(0); });
    expect_gguf_error_or_value([&] { sink = sink + f.opt_f32(kv.key).has_value(); });
  }
  expect_gguf_error_or_value([&] { sink = sink + f.get_u32("llama.block_count"); });
  expect_gguf_error_or_value([&] { sink = sink + f.tensor("token_embd.weight").n_bytes; });
  // A valid file may declare an alignment far beyond its size (no tensors);
  // rewriting it would pad the header to that size, which is correct but
  // would only measure the allocator.
  if (f.alignment() <= (1u << 20)) round_trip(f);
  return 0;
}
