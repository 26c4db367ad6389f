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
// Thread-safety: the functions are reentrant; the File is only read.
#pragma once

#include <string>
#include <string_view>

#include "encore/gguf.h"

namespace encore {

// Hashes tensors on up to `n_threads` threads (values < 1 mean 1). The
// result does not depend on the thread count or the load mode.
std::string model_fingerprint(const gguf::File& file, int n_threads = 1);

// As model_fingerprint, but remembers results in `cache_dir` (default:
// fingerprint_cache_dir()), one small file per absolute model path recording
// the path, size, mtime (ns) and fingerprint. An entry is used only if the
// size and mtime of `path` still match. `file` must be `path` opened. If the
// cache cannot be read or written the fingerprint is just computed. Sets
// *from_cache (if given) to whether the cached value was used.
std::string model_fingerprint_cached(const std::string& path, const gguf::File& file, int n_threads,
                                     bool* from_cache = nullptr, const std::string& cache_dir = {});

// The same, for the path the File was opened from (file.path()). A File
// made by from_bytes has no stamp on disk, so it is always hashed.
std::string model_fingerprint_cached(const gguf::File& file, int n_threads,
                                     bool* from_cache = nullptr, const std::string& cache_dir = {});

// $XDG_CACHE_HOME/encore/fingerprints, else $HOME/.cache/encore/fingerprints,
// else "" (no cache).
std::string fingerprint_cache_dir();

// True for descriptive keys left out of the fingerprint: general.name,
// .author, .description, .url, .license*, .source.*, .tags, .languages,
// .file_type, .alignment and similar provenance keys. Other general.* keys
// (general.architecture, general.quantization_version, ...) are covered.
bool fingerprint_ignores_key(std::string_view key);

}  // namespace encore
