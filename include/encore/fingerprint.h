// Content fingerprint of a GGUF model: a 32-hex-digit XXH3-128 digest of
// everything that affects inference, used to key caches and to tell
// whether two files hold the same model.
//
// Covered: every metadata entry except descriptive general.* keys (see
// fingerprint_ignores_key), canonically encoded (GGUF bytes of key, type and
// value) and sorted by key; then, in file order, each tensor's name, type,
// dims and an XXH3-128 digest of its data. Not covered: the file layout
// (alignment, order of keys, data offsets), so re-aligning or re-ordering
// metadata keeps the fingerprint.
//
// Cost: reads every tensor byte once (XXH3 runs at several GB/s per
// thread; with LoadMode::Mmap the page faults usually dominate).
// Thread-safety: the File is only read; the functions run their work on the
// given ThreadPool, so they must not be called concurrently with other work
// on that pool (ThreadPool::parallel_for's rule).
#pragma once

#include <string>
#include <string_view>

#include "encore/dtype.h"
#include "encore/gguf.h"

namespace encore {

class ThreadPool;

// Hashes tensors on the threads of `pool`. The result does not depend on the
// pool's size or the load mode.
std::string model_fingerprint(const gguf::File& file, ThreadPool& pool);

// As model_fingerprint, but remembers results in `cache_dir` (default:
// fingerprint_cache_dir()), one small file per absolute model path recording
// the path, the File's stamp (device, inode, size, mtime and ctime of the
// descriptor it was opened from, see gguf::FileStamp) and the fingerprint.
// An entry is used only if it records exactly file.stamp(), and written only
// if `path` still has that stamp after hashing, so a file replaced or
// rewritten (even with the same size and mtime) is hashed again. `file` must
// be `path` opened. If the File has no stamp or the cache cannot be read or
// written, the fingerprint is just computed. Sets *from_cache (if given) to
// whether the cached value was used.
std::string model_fingerprint_cached(const std::string& path, const gguf::File& file,
                                     ThreadPool& pool, bool* from_cache = nullptr,
                                     const std::string& cache_dir = {});

// The same, for the path the File was opened from (file.path()). A File
// made by from_bytes has no stamp, so it is always hashed.
std::string model_fingerprint_cached(const gguf::File& file, ThreadPool& pool,
                                     bool* from_cache = nullptr, const std::string& cache_dir = {});

// True for what model_fingerprint returns: 32 lowercase hex digits.
bool is_model_fingerprint(std::string_view s);

// $XDG_CACHE_HOME/encore/fingerprints, else $HOME/.cache/encore/fingerprints,
// else "" (no cache).
std::string fingerprint_cache_dir();

// True for descriptive keys left out of the fingerprint: general.author,
// .description, .url, .license*, .source.*, .tags, .languages, .file_type,
// .alignment and similar provenance keys. Other general.* keys
// (general.architecture, general.quantization_version, ...) are covered, and
// so is general.name: the tokenizer switches Phi-3's whitespace handling on
// it, so it can change the output.
bool fingerprint_ignores_key(std::string_view key);

// ---------------------------------------------------------------------------
// System fingerprint (like OpenAI's `system_fingerprint`): outputs are
// guaranteed identical only under an identical fingerprint, so it must never
// be equal for a model, build or setting that could give different numbers.
// A false "different" is harmless; a false "same" breaks the promise.
//
// Covered: the model fingerprint, engine_version_string() and
// build_id_string() (encore/version.h: every source file, the compiler and
// build flags), and every NumericsSettings field below.
// Deliberately NOT covered, because docs/invariance.md proves (and the
// invariance tests check) that they change no bit: thread count, ISA
// (scalar/AVX2/AVX-512), batch composition, prefill chunk size, KV block
// size, mmap vs read loading. Also not covered: the request itself (prompt,
// seed, sampling parameters), which the caller compares separately.
// Adding a setting that can change numerics means adding it here and bumping
// the encoding version in src/gguf/system_fingerprint.cpp.

// Every setting outside the model file that can change numerics.
struct NumericsSettings {
  // The version of the kernels' canonical order (src/kernels/
  // matmul_internal.h): fixed by the binary, a field so that state computed
  // under an older order (1: SIMD lanes along K) is named and never used.
  int canonical_order = 2;
  DType kv_type = DType::F16;  // KV cache element type
  float rope_freq_base = 0;    // effective values used by the forward pass (0 = none given)
  float rope_freq_scale = 0;
};

// "fp_" + 32 lowercase hex digits: XXH3-128 over a canonical, versioned text
// encoding of (model_fp, engine_version_string(), build_id_string(), each
// NumericsSettings field with its name; floats by their exact bit pattern, so
// -0.0 and 0.0 differ). Pure function of its inputs and the binary; cheap.
std::string system_fingerprint(std::string_view model_fp, const NumericsSettings& s);

}  // namespace encore
