// The panel cache file (panel_file.h): writing, checking and mapping it.
#include "model/panel_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <xxhash.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <regex>
#include <system_error>

#include "encore/error.h"
#include "encore/fingerprint.h"
#include "encore/gguf.h"
#include "encore/thread_pool.h"
#include "kernels/matmul.h"
#include "util/little_endian.h"
#include "util/temp_file.h"
#include "util/text.h"

namespace encore {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kMagic = "ENCPANEL";
constexpr uint64_t kAlign = 4096;             // header padding: the panels start on a page
constexpr uint64_t kMaxHeader = 64ull << 20;  // ~1.6 M matrices: bounds what a header may claim
constexpr size_t kMaxPath = 4096;
constexpr size_t kFixed = 8 + 4 * 4 + 8 * 2 + 32 + 8 * 2 + 4;  // up to the path
constexpr size_t kEntry = 4 * 2 + 8 * 5;

using util::errno_text;

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool pread_all(int fd, uint8_t* dst, uint64_t n, uint64_t at) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, dst, n, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    dst += r;
    at += static_cast<uint64_t>(r);
    n -= static_cast<uint64_t>(r);
  }
  return true;
}

uint64_t round_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// The header bytes (without the final digest) of a file holding `matrices`.
// Throws Error for an origin the format cannot hold.
std::string encode_header(const PanelFileOrigin& o, const std::vector<PanelFileHeader::Matrix>& ms,
                          uint64_t panel_bytes) {
  if (!is_model_fingerprint(o.model_fingerprint) || o.model_path.size() > kMaxPath) {
    throw Error(
        fmt::format("a panel file records a 32-digit model fingerprint and a path of at "
                    "most {} bytes (got {} and {} bytes)",
                    kMaxPath, util::printable(o.model_fingerprint), o.model_path.size()));
  }
  const uint64_t header_bytes = round_up(kFixed + o.model_path.size() + ms.size() * kEntry + 8);
  std::string h(kMagic);
  le::put_u32(h, kPanelFileFormat);
  le::put_u32(h, kernels::kPanelLayout);
  le::put_u32(h, kernels::kCanonicalOrder);
  le::put_u32(h, static_cast<uint32_t>(ms.size()));
  le::put_u64(h, header_bytes);
  le::put_u64(h, panel_bytes);
  h += o.model_fingerprint;
  le::put_u64(h, o.model_size);
  le::put_u64(h, static_cast<uint64_t>(o.model_mtime_ns));
  le::put_u32(h, static_cast<uint32_t>(o.model_path.size()));
  h += o.model_path;
  for (const PanelFileHeader::Matrix& m : ms) {
    le::put_u32(h, static_cast<uint32_t>(m.m.type));
    le::put_u32(h, 0);
    le::put_u64(h, static_cast<uint64_t>(m.m.rows));
    le::put_u64(h, static_cast<uint64_t>(m.m.cols));
    le::put_u64(h, m.m.offset);
    le::put_u64(h, m.m.bytes);
    le::put_u64(h, m.digest);
  }
  return h;
}

// Parses a header (`b`: its first bytes, at least kFixed, or all of it once
// header_bytes is known). Returns nullopt with *why when it is not ours.
std::optional<PanelFileHeader> decode_header(std::string_view b, uint64_t file_bytes,
                                             std::string* why, bool verify_digest) {
  auto fail = [&](std::string w) {
    *why = std::move(w);
    return std::nullopt;
  };
  if (b.size() < kFixed || b.substr(0, 8) != kMagic) return fail("not a panel file (magic)");
  PanelFileHeader h;
  h.format = static_cast<uint32_t>(le::get(b, 8, 4));
  h.layout = static_cast<uint32_t>(le::get(b, 12, 4));
  h.order = static_cast<uint32_t>(le::get(b, 16, 4));
  const uint64_t n = le::get(b, 20, 4);
  h.header_bytes = le::get(b, 24, 8);
  h.panel_bytes = le::get(b, 32, 8);
  if (h.format != kPanelFileFormat || h.layout != kernels::kPanelLayout ||
      h.order != static_cast<uint32_t>(kernels::kCanonicalOrder)) {
    return fail(fmt::format("format {} layout {} order {}, this build writes {} {} {}", h.format,
                            h.layout, h.order, kPanelFileFormat, kernels::kPanelLayout,
                            kernels::kCanonicalOrder));
  }
  if (h.header_bytes % kAlign != 0 || h.header_bytes == 0 || h.header_bytes > kMaxHeader ||
      h.panel_bytes > file_bytes || h.header_bytes != file_bytes - h.panel_bytes) {
    return fail(fmt::format("sizes: header {} + panels {} bytes in a file of {}", h.header_bytes,
                            h.panel_bytes, file_bytes));
  }
  if (b.size() < h.header_bytes) return fail("short header");  // the caller reads it all
  h.origin.model_fingerprint = std::string(b.substr(40, 32));
  if (!is_model_fingerprint(h.origin.model_fingerprint)) return fail("not a model fingerprint");
  h.origin.model_size = le::get(b, 72, 8);
  h.origin.model_mtime_ns = static_cast<int64_t>(le::get(b, 80, 8));
  const uint64_t path_len = le::get(b, 88, 4);
  const uint64_t digest_at = kFixed + path_len + n * kEntry;
  // One encoding per header: the padding is exactly what the writer adds.
  if (path_len > kMaxPath || digest_at + 8 > h.header_bytes ||
      h.header_bytes != round_up(digest_at + 8)) {
    return fail("header fields overflow");
  }
  if (verify_digest && XXH3_64bits(b.data(), digest_at) != le::get(b, digest_at, 8)) {
    return fail("header digest");
  }
  if (b.substr(digest_at + 8, h.header_bytes - digest_at - 8).find_first_not_of('\0') !=
      std::string_view::npos) {
    return fail("header padding");
  }
  h.origin.model_path = std::string(b.substr(kFixed, path_len));
  uint64_t end = 0;
  for (uint64_t i = 0, at = kFixed + path_len; i < n; ++i, at += kEntry) {
    PanelFileHeader::Matrix m;
    m.m.type = static_cast<DType>(le::get(b, at, 4));
    if (le::get(b, at + 4, 4) != 0) return fail(fmt::format("matrix {}: reserved field", i));
    m.m.rows = static_cast<int64_t>(le::get(b, at + 8, 8));
    m.m.cols = static_cast<int64_t>(le::get(b, at + 16, 8));
    m.m.offset = le::get(b, at + 24, 8);
    m.m.bytes = le::get(b, at + 32, 8);
    m.digest = le::get(b, at + 40, 8);
    if (m.m.offset < end || m.m.bytes > h.panel_bytes || m.m.offset > h.panel_bytes - m.m.bytes) {
      return fail(fmt::format("matrix {} lies outside the panels", i));
    }
    end = m.m.offset + m.m.bytes;
    h.matrices.push_back(m);
  }
  return h;
}

// The XXH3-64 digests of each matrix's panels in `block`, on `pool`.
std::vector<uint64_t> digests(const std::vector<Model::PanelMatrix>& layout, const uint8_t* block,
                              ThreadPool& pool) {
  std::vector<uint64_t> d(layout.size());
  const auto n = static_cast<int64_t>(layout.size());
  // One matrix per chunk, claimed as threads become free (the output head
  // is several times a layer matrix).
  pool.parallel_for(
      n,
      [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; ++i) {
          d[i] = XXH3_64bits(block + layout[i].offset, layout[i].bytes);
        }
      },
      static_cast<int>((n + pool.size() - 1) / pool.size()));
  return d;
}

// Maps `path` when it holds exactly the panels of `layout` for `fp`.
std::shared_ptr<const uint8_t> map_checked(const std::string& path, const std::string& fp,
                                           const std::vector<Model::PanelMatrix>& layout,
                                           size_t panel_bytes, ThreadPool& pool, std::string* why) {
  std::optional<PanelFileHeader> h = read_panel_file_header(path, why);
  if (!h) return nullptr;
  if (h->origin.model_fingerprint != fp) {
    *why = fmt::format("of another model ({})", util::printable(h->origin.model_fingerprint));
    return nullptr;
  }
  bool same = h->panel_bytes == panel_bytes && h->matrices.size() == layout.size();
  for (size_t i = 0; same && i < layout.size(); ++i) {
    const Model::PanelMatrix &a = h->matrices[i].m, &b = layout[i];
    same = a.type == b.type && a.rows == b.rows && a.cols == b.cols && a.offset == b.offset &&
           a.bytes == b.bytes;
  }
  if (!same) {
    *why = "its matrices are not this model's";
    return nullptr;
  }
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  struct stat st;
  if (f.fd < 0 || ::fstat(f.fd, &st) != 0) {
    *why = fmt::format("cannot open it: {}", errno_text(errno));
    return nullptr;
  }
  if (!S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) != h->header_bytes + h->panel_bytes) {
    *why = "it changed while being read";
    return nullptr;
  }
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, f.fd, 0);
  if (p == MAP_FAILED) {
    *why = fmt::format("cannot map it: {}", errno_text(errno));
    return nullptr;
  }
  std::shared_ptr<const uint8_t> whole(static_cast<const uint8_t*>(p), [size](const uint8_t* q) {
    ::munmap(const_cast<uint8_t*>(q), size);
  });
  const uint8_t* block = whole.get() + h->header_bytes;
  const std::vector<uint64_t> d = digests(layout, block, pool);
  for (size_t i = 0; i < d.size(); ++i) {
    if (d[i] != h->matrices[i].digest) {
      *why = fmt::format("the panels of matrix {} do not match their digest", i);
      return nullptr;
    }
  }
  return std::shared_ptr<const uint8_t>(whole, block);  // keeps the whole mapping
}

// Writes the model's panels (in memory) to `path`; throws Error.
void write_panel_file(const std::string& path, const Model& model, const PanelFileOrigin& origin,
                      ThreadPool& pool) {
  const std::vector<Model::PanelMatrix> layout = model.panel_layout();
  const std::vector<uint64_t> d = digests(layout, model.panels(), pool);
  std::vector<PanelFileHeader::Matrix> ms;
  for (size_t i = 0; i < layout.size(); ++i) ms.push_back({layout[i], d[i]});
  PanelFileHeader head;
  head.origin = origin;
  head.panel_bytes = model.repacked_bytes();
  head.matrices = std::move(ms);
  const std::string h = encode_panel_file_header(head);
  util::TempFile out(path);
  out.write(h);
  out.write(model.panels(), model.repacked_bytes());
  out.commit();
}

}  // namespace

std::string default_panel_cache_dir() {
  std::string dir = util::cache_dir();
  if (!dir.empty()) dir.append("/panels");
  return dir;
}

std::string panel_file_name(const std::string& model_fingerprint) {
  return fmt::format("{}-l{}-o{}.panels", model_fingerprint, kernels::kPanelLayout,
                     kernels::kCanonicalOrder);
}

std::optional<PanelFileHeader> read_panel_file_header(const std::string& path, std::string* why,
                                                      bool* unreadable) {
  if (unreadable != nullptr) *unreadable = false;
  const auto cannot = [&](const std::string& what) {
    *why = fmt::format("{}: {}", what, errno_text(errno));
    if (unreadable != nullptr) *unreadable = true;
    return std::nullopt;
  };
  // O_NONBLOCK: a FIFO under this name must not hang the open.
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  struct stat st;
  if (f.fd < 0 || ::fstat(f.fd, &st) != 0) return cannot("cannot open it");
  if (!S_ISREG(st.st_mode)) {
    *why = "not a regular file";
    return std::nullopt;
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  std::string b(std::min<uint64_t>(size, kAlign), '\0');
  if (!pread_all(f.fd, reinterpret_cast<uint8_t*>(b.data()), b.size(), 0)) {
    return cannot("cannot read its header");
  }
  std::optional<PanelFileHeader> h = decode_header(b, size, why, true);
  if (h || *why != "short header") return h;
  // The sizes checked out (header_bytes <= kMaxHeader): read the rest.
  const uint64_t header_bytes = le::get(b, 24, 8);
  b.resize(header_bytes, '\0');
  if (!pread_all(f.fd, reinterpret_cast<uint8_t*>(b.data()) + kAlign, header_bytes - kAlign,
                 kAlign)) {
    return cannot("cannot read its header");
  }
  return decode_header(b, size, why, true);
}

std::optional<PanelFileHeader> decode_panel_file_header(std::string_view bytes, uint64_t file_bytes,
                                                        std::string* why, bool verify_digest) {
  return decode_header(bytes, file_bytes, why, verify_digest);
}

std::string encode_panel_file_header(const PanelFileHeader& head) {
  std::string h = encode_header(head.origin, head.matrices, head.panel_bytes);
  le::put_u64(h, XXH3_64bits(h.data(), h.size()));
  h.resize(round_up(h.size()), '\0');
  return h;
}

PanelCacheUse use_panel_cache(Model& model, ThreadPool& pool, const std::string& path,
                              const PanelFileOrigin& origin,
                              const std::function<void(std::span<const uint8_t>)>& release) {
  PanelCacheUse use;
  const auto add_problem = [&use](const std::string& p) {
    use.problem += (use.problem.empty() ? "" : "; ") + p;
  };
  const std::vector<Model::PanelMatrix> layout = model.panel_layout();
  const size_t bytes = model.panel_block_bytes();
  if (bytes == 0) return use;  // nothing to repack
  std::error_code ec;
  if (fs::exists(path, ec)) {
    std::string why;
    if (std::shared_ptr<const uint8_t> block =
            map_checked(path, origin.model_fingerprint, layout, bytes, pool, &why)) {
      model.adopt_panels(std::move(block), bytes);
      use.hit = true;
      return use;
    }
    add_problem(fmt::format("{}: not used ({}); writing it again", path, why));
  }
  model.repack_weights(pool, release);
  try {
    fs::create_directories(fs::path(path).parent_path(), ec);
    if (ec) {
      throw Error(fmt::format("cannot make the directory {}: {}",
                              fs::path(path).parent_path().string(), ec.message()));
    }
    write_panel_file(path, model, origin, pool);
  } catch (const Error& e) {
    add_problem(
        fmt::format("cannot write the panel cache ({}): the panels stay in memory", e.what()));
    return use;
  }
  // Map what was written, so that this process shares the pages too (and
  // the anonymous copy goes).
  std::string why;
  if (std::shared_ptr<const uint8_t> block =
          map_checked(path, origin.model_fingerprint, layout, bytes, pool, &why)) {
    model.adopt_panels(std::move(block), bytes);
    use.written = true;
  } else {
    add_problem(
        fmt::format("{}: written but not usable ({}): the panels stay in memory", path, why));
  }
  return use;
}

std::vector<std::pair<std::string, std::string>> collect_panel_garbage(const std::string& dir,
                                                                       bool dry_run) {
  std::vector<std::pair<std::string, std::string>> out;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  // Only names this code writes (panel_file_name, util::TempFile's).
  static const std::regex kPanels("[0-9a-f]{32}-l[0-9]+-o[0-9]+\\.panels");
  static const std::regex kTemp("[0-9a-f]{32}-l[0-9]+-o[0-9]+\\.panels\\.tmp-[0-9a-f]{16}");
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    std::error_code e2;
    if (!it->is_regular_file(e2)) continue;
    const std::string name = it->path().filename().string();
    std::string reason;
    if (std::regex_match(name, kTemp)) {
      if (now - it->last_write_time(e2) > std::chrono::minutes(10)) reason = "interrupted write";
    } else if (std::regex_match(name, kPanels)) {
      std::string why;
      bool unreadable = false;
      const std::optional<PanelFileHeader> h =
          read_panel_file_header(it->path().string(), &why, &unreadable);
      if (unreadable) continue;  // perhaps for now only (permissions, EIO): not its content
      if (!h) {
        reason = why;
      } else {
        const std::string& mp = h->origin.model_path;
        const std::optional<gguf::FileStamp> now_stamp = gguf::stamp_of(mp);
        if (!now_stamp) {
          reason = fmt::format("its model {} is gone", util::printable(mp));
        } else if (now_stamp->size != h->origin.model_size ||
                   now_stamp->mtime_ns != h->origin.model_mtime_ns) {
          reason = fmt::format("its model {} has changed", util::printable(mp));
        }
      }
    }
    if (reason.empty()) continue;
    if (!dry_run && !fs::remove(it->path(), e2)) continue;
    out.emplace_back(it->path().string(), reason);
  }
  return out;
}

}  // namespace encore
