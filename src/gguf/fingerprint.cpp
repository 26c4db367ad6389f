// Model content fingerprint (see include/encore/fingerprint.h).
#include "encore/fingerprint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "gguf/internal.h"

namespace encore {
namespace {

// Bumped whenever what is hashed changes, so old cache entries and stored
// fingerprints never match new ones by accident.
constexpr std::string_view kDomain = "encore-fingerprint-v1";
constexpr std::string_view kCacheHeader = "encore-fingerprint-cache 1";

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

// Digests of every tensor's data, computed by a pool of short-lived threads
// that pull tensors from a shared counter; each digest depends only on its
// tensor, so the result is the same for any thread count.
std::vector<XXH128_hash_t> hash_tensors(const std::vector<gguf::TensorInfo>& tensors,
                                        int n_threads) {
  std::vector<XXH128_hash_t> digests(tensors.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next.fetch_add(1); k < tensors.size(); k = next.fetch_add(1)) {
      digests[k] = XXH3_128bits(tensors[k].data, tensors[k].n_bytes);
    }
  };
  const size_t n_workers =
      std::min<size_t>(static_cast<size_t>(std::max(n_threads, 1)), tensors.size());
  {
    std::vector<std::jthread> helpers;  // joined on scope exit, also if a spawn throws
    for (size_t k = 1; k < n_workers; ++k) helpers.emplace_back(work);
    work();
  }
  return digests;
}

struct FileStamp {
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

bool stamp_of(const std::string& path, FileStamp* out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  out->size = static_cast<uint64_t>(st.st_size);
  out->mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  return true;
}

bool is_fingerprint(const std::string& s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

// The cached fingerprint for `abs_path` if the entry matches `stamp`.
std::string read_cache_entry(const std::filesystem::path& entry, const std::string& abs_path,
                             const FileStamp& stamp) {
  // An entry is a few hundred bytes; anything much larger is not ours.
  std::error_code ec;
  const auto size = std::filesystem::file_size(entry, ec);
  if (ec || size > 65536) return "";
  std::ifstream in(entry);
  std::string header, path_line, size_line, mtime_line, fp_line;
  if (!std::getline(in, header) || !std::getline(in, path_line) || !std::getline(in, size_line) ||
      !std::getline(in, mtime_line) || !std::getline(in, fp_line)) {
    return "";
  }
  if (header != kCacheHeader || path_line != "path " + abs_path ||
      size_line != fmt::format("size {}", stamp.size) ||
      mtime_line != fmt::format("mtime_ns {}", stamp.mtime_ns) ||
      fp_line.rfind("fingerprint ", 0) != 0) {
    return "";
  }
  std::string fp = fp_line.substr(12);
  return is_fingerprint(fp) ? fp : "";
}

// Best effort: any failure leaves the cache as it was.
void write_cache_entry(const std::filesystem::path& entry, const std::string& abs_path,
                       const FileStamp& stamp, const std::string& fp) {
  std::error_code ec;
  std::filesystem::create_directories(entry.parent_path(), ec);
  if (ec) return;
  std::random_device rd;
  const std::filesystem::path tmp = fmt::format("{}.tmp-{:08x}", entry.string(), rd());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << kCacheHeader << "\npath " << abs_path << "\nsize " << stamp.size << "\nmtime_ns "
        << stamp.mtime_ns << "\nfingerprint " << fp << "\n";
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, entry, ec);  // atomic: readers see old or new entry
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

bool fingerprint_ignores_key(std::string_view key) {
  static constexpr std::string_view kExact[] = {
      "general.name",      "general.author",     "general.description",  "general.url",
      "general.license",   "general.tags",       "general.languages",    "general.file_type",
      "general.alignment", "general.version",    "general.organization", "general.finetune",
      "general.basename",  "general.size_label", "general.repo_url",     "general.doi",
      "general.uuid",      "general.datasets",   "general.quantized_by", "general.homepage",
      "general.title",
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

std::string model_fingerprint(const gguf::File& file, int n_threads) {
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
  const std::vector<XXH128_hash_t> digests = hash_tensors(tensors, n_threads);
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

std::string fingerprint_cache_dir() {
  // XDG: a relative XDG_CACHE_HOME is invalid and must be ignored.
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/encore/fingerprints";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') return std::string(home) + "/.cache/encore/fingerprints";
  return "";
}

std::string model_fingerprint_cached(const std::string& path, const gguf::File& file, int n_threads,
                                     bool* from_cache, const std::string& cache_dir) {
  if (from_cache != nullptr) *from_cache = false;
  const std::string dir = cache_dir.empty() ? fingerprint_cache_dir() : cache_dir;
  std::error_code ec;
  const std::string abs_path = std::filesystem::absolute(path, ec).lexically_normal().string();
  FileStamp before;
  // Without a usable cache location, path or stamp, just compute. A newline
  // in the path would break the line-based entry format.
  if (dir.empty() || ec || abs_path.find('\n') != std::string::npos || !stamp_of(path, &before) ||
      before.size != file.file_size()) {
    return model_fingerprint(file, n_threads);
  }
  const std::filesystem::path entry =
      std::filesystem::path(dir) /
      fmt::format("{:016x}.fp", XXH3_64bits(abs_path.data(), abs_path.size()));
  std::string fp = read_cache_entry(entry, abs_path, before);
  if (!fp.empty()) {
    if (from_cache != nullptr) *from_cache = true;
    return fp;
  }
  fp = model_fingerprint(file, n_threads);
  // Store only if the file did not change while it was hashed; otherwise the
  // entry could pair the new stamp with the old content.
  FileStamp after;
  if (stamp_of(path, &after) && after == before) write_cache_entry(entry, abs_path, before, fp);
  return fp;
}

std::string model_fingerprint_cached(const gguf::File& file, int n_threads, bool* from_cache,
                                     const std::string& cache_dir) {
  return model_fingerprint_cached(file.path(), file, n_threads, from_cache, cache_dir);
}

}  // namespace encore
