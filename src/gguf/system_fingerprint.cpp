// System fingerprint (see include/encore/fingerprint.h, bottom half).
#include <fmt/format.h>
#include <xxhash.h>

#include <bit>
#include <cstdint>

#include "encore/fingerprint.h"
#include "encore/version.h"
#include "kernels/matmul.h"

namespace encore {
namespace {

// Bumped whenever the encoding or the set of fields changes, so a new binary
// never reproduces an old fingerprint over different inputs.
constexpr std::string_view kDomain = "encore-system-fingerprint-v2";
static_assert(NumericsSettings{}.canonical_order == kernels::kCanonicalOrder,
              "the fingerprint's default order is the kernels' own");

// One "name <length>:<value>" line. The length prefix keeps the encoding
// unambiguous whatever the values contain (a model_fp is caller input).
void field(std::string& out, std::string_view name, std::string_view value) {
  out += fmt::format("{} {}:{}\n", name, value.size(), value);
}

// Exact bit pattern: -0.0 vs 0.0 or two NaN payloads must not compare equal.
std::string float_bits(float v) { return fmt::format("{:08x}", std::bit_cast<uint32_t>(v)); }

}  // namespace

std::string system_fingerprint(std::string_view model_fp, const NumericsSettings& s) {
  std::string text;
  field(text, "domain", kDomain);
  field(text, "model_fp", model_fp);
  field(text, "engine_version", engine_version_string());
  field(text, "build_id", build_id_string());
  field(text, "canonical_order", fmt::format("{}", s.canonical_order));
  // Raw GGUF type id (stable numbering) plus its name for readability; the
  // id alone decides, so an unknown value still hashes distinctly.
  const auto raw = static_cast<uint32_t>(s.kv_type);
  const DTypeInfo* info = dtype_info(raw);
  field(text, "kv_type", fmt::format("{}/{}", raw, info != nullptr ? info->name : "?"));
  field(text, "rope_freq_base", float_bits(s.rope_freq_base));
  field(text, "rope_freq_scale", float_bits(s.rope_freq_scale));

  XXH128_canonical_t c;  // big-endian digest bytes: same hex on every host
  XXH128_canonicalFromHash(&c, XXH3_128bits(text.data(), text.size()));
  std::string out = "fp_";
  for (unsigned char b : c.digest) out += fmt::format("{:02x}", b);
  return out;
}

}  // namespace encore
