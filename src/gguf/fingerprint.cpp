// Model content fingerprint (see include/encore/fingerprint.h).
#include "encore/fingerprint.h"

#include <sys/stat.h>

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <vector>

#include "encore/error.h"
#include "encore/thread_pool.h"
#include "gguf/internal.h"
#include "util/temp_file.h"
#include "util/text.h"

namespace encore {
namespace {

// Bumped whenever what is hashed changes, so old cache entries and stored
// fingerprints never match new ones by accident (v2: general.name is hashed).
constexpr std::string_view kDomain = "encore-fingerprint-v2";
constexpr std::string_view kCacheHeader = "encore-fingerprint-cache 2";

struct StateDeleter {
  void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
};

std::string hex(const XXH128_hash_t& h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  std::string out;
  for (unsigned char b : c.digest) out += fmt::format("{:02x}", b);
  return out;
}

// Digests of every tensor's data, whole tensors in chunks that threads claim
// as they become free, so that a few large tensors do not leave threads idle
// as one static slice each would. Each digest depends only on its tensor,
// so the result is the same for any pool size.
std::vector<XXH128_hash_t> hash_tensors(const std::vector<gguf::TensorInfo>& tensors,
                                        ThreadPool& pool) {
  std::vector<XXH128_hash_t> digests(tensors.size());  // [n_tensors], digest of tensors[k].data
  // About one tensor per chunk: tensors differ in size by 100x and more.
  const auto n = static_cast<int64_t>(tensors.size());
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e, int) {
        for (int64_t k = b; k < e; ++k) {
          digests[k] = XXH3_128bits(tensors[k].data, tensors[k].n_bytes);
        }
      },
      static_cast<int>((n + pool.size() - 1) / pool.size()));
  return digests;
}

std::string stamp_line(const gguf::FileStamp& s) {
  return fmt::format("stamp {} {} {} {} {}", s.device, s.inode, s.size, s.mtime_ns, s.ctime_ns);
}

// The cached fingerprint for `abs_path` if the entry records `stamp`.
std::string read_cache_entry(const std::filesystem::path& entry, const std::string& abs_path,
                             const gguf::FileStamp& stamp) {
  // An entry is a few hundred bytes; anything much larger is not ours.
  std::error_code ec;
  const auto size = std::filesystem::file_size(entry, ec);
  if (ec || size > 65536) return "";
  std::ifstream in(entry);
  std::string header, path_line, stamp_text, fp_line;
  if (!std::getline(in, header) || !std::getline(in, path_line) || !std::getline(in, stamp_text) ||
      !std::getline(in, fp_line)) {
    return "";
  }
  if (header != kCacheHeader || path_line != "path " + abs_path ||
      stamp_text != stamp_line(stamp) || fp_line.rfind("fingerprint ", 0) != 0) {
    return "";
  }
  std::string fp = fp_line.substr(12);
  return is_model_fingerprint(fp) ? fp : "";
}

// Best effort: any failure leaves the cache as it was (the write is atomic,
// so readers see the old entry or the new one).
void write_cache_entry(const std::filesystem::path& entry, const std::string& abs_path,
                       const gguf::FileStamp& stamp, const std::string& fp) {
  std::error_code ec;
  std::filesystem::create_directories(entry.parent_path(), ec);
  if (ec) return;
  try {
    util::TempFile out(entry.string());
    out.write(fmt::format("{}\npath {}\n{}\nfingerprint {}\n", kCacheHeader, abs_path,
                          stamp_line(stamp), fp));
    out.commit();
  } catch (const Error&) {
  }
}

}  // namespace

bool fingerprint_ignores_key(std::string_view key) {
  static constexpr std::string_view kExact[] = {
      // Not general.name: vocab_from_gguf keys Phi-3's whitespace handling on it.
      "general.author",     "general.description",  "general.url",       "general.license",
      "general.tags",       "general.languages",    "general.file_type", "general.alignment",
      "general.version",    "general.organization", "general.finetune",  "general.basename",
      "general.size_label", "general.repo_url",     "general.doi",       "general.uuid",
      "general.datasets",   "general.quantized_by", "general.homepage",  "general.title",
  };
  static constexpr std::string_view kPrefixes[] = {
      "general.license.",
      "general.source.",
      "general.base_model.",
      "general.dataset.",
  };
  if (key.rfind("general.", 0) != 0) return false;
  for (std::string_view k : kExact) {
    if (key == k) return true;
  }
  for (std::string_view p : kPrefixes) {
    if (key.rfind(p, 0) == 0) return true;
  }
  return false;
}

std::string model_fingerprint(const gguf::File& file, ThreadPool& pool) {
  std::unique_ptr<XXH3_state_t, StateDeleter> state(XXH3_createState());
  if (!state) throw std::bad_alloc();
  XXH3_128bits_reset(state.get());
  std::vector<uint8_t> buf;
  auto flush = [&] {
    XXH3_128bits_update(state.get(), buf.data(), buf.size());
    buf.clear();
  };
  buf.insert(buf.end(), kDomain.begin(), kDomain.end());

  std::vector<const gguf::KeyValue*> kvs;
  for (const gguf::KeyValue& kv : file.metadata()) {
    if (!fingerprint_ignores_key(kv.key)) kvs.push_back(&kv);
  }
  std::sort(kvs.begin(), kvs.end(),
            [](const gguf::KeyValue* a, const gguf::KeyValue* b) { return a->key < b->key; });
  gguf::detail::append_u64(buf, kvs.size());
  for (const gguf::KeyValue* kv : kvs) {
    gguf::detail::append_kv(buf, kv->key, kv->value);
    flush();  // keeps the buffer small even for large vocabularies
  }

  const std::vector<gguf::TensorInfo>& tensors = file.tensors();
  const std::vector<XXH128_hash_t> digests = hash_tensors(tensors, pool);  // [n_tensors]
  gguf::detail::append_u64(buf, tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const gguf::TensorInfo& t = tensors[k];
    gguf::detail::append_string(buf, t.name);
    gguf::detail::append_u32(buf, static_cast<uint32_t>(t.type));
    gguf::detail::append_u32(buf, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) gguf::detail::append_u64(buf, d);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, digests[k]);
    buf.insert(buf.end(), c.digest, c.digest + sizeof(c.digest));
  }
  flush();
  return hex(XXH3_128bits_digest(state.get()));
}

bool is_model_fingerprint(std::string_view s) {
  return s.size() == 32 && s.find_first_not_of("0123456789abcdef") == std::string_view::npos;
}

std::string fingerprint_cache_dir() {
  std::string dir = util::cache_dir();
  if (!dir.empty()) dir.append("/fingerprints");
  return dir;
}

std::string model_fingerprint_cached(const std::string& path, const gguf::File& file,
                                     ThreadPool& pool, bool* from_cache,
                                     const std::string& cache_dir) {
  if (from_cache != nullptr) *from_cache = false;
  const std::string dir = cache_dir.empty() ? fingerprint_cache_dir() : cache_dir;
  const std::optional<gguf::FileStamp>& stamp = file.stamp();
  std::error_code ec;
  const std::string abs_path = std::filesystem::absolute(path, ec).lexically_normal().string();
  // Without a usable cache location, path or stamp, just compute. A newline
  // in the path would break the line-based entry format.
  if (dir.empty() || !stamp || ec || abs_path.find('\n') != std::string::npos) {
    return model_fingerprint(file, pool);
  }
  const std::filesystem::path entry =
      std::filesystem::path(dir) /
      fmt::format("{:016x}.fp", XXH3_64bits(abs_path.data(), abs_path.size()));
  std::string fp = read_cache_entry(entry, abs_path, *stamp);
  if (!fp.empty()) {
    if (from_cache != nullptr) *from_cache = true;
    return fp;
  }
  fp = model_fingerprint(file, pool);
  // Store only if `path` is still the file that was opened, unchanged: a
  // mapped file written in place while it was hashed, or a `path` that names
  // another file, must not leave an entry pairing this stamp with this value.
  if (gguf::stamp_of(path) == stamp) write_cache_entry(entry, abs_path, *stamp, fp);
  return fp;
}

std::string model_fingerprint_cached(const gguf::File& file, ThreadPool& pool, bool* from_cache,
                                     const std::string& cache_dir) {
  return model_fingerprint_cached(file.path(), file, pool, from_cache, cache_dir);
}

}  // namespace encore
