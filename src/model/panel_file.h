// The panel cache file: a model's repacked weights (Model::repack_weights)
// written once under the cache directory and mapped read-only by every
// process that opens the same model with --mmap, so replicas on one host
// share its pages and none of them repacks or holds a private copy. The
// model file itself is never modified.
//
// Named panel_file_name(model fingerprint): the model's content and the
// panel layout are the key. Written atomically (util::TempFile) and checked
// on every use (every field of the header against the model, an XXH3 digest
// of the header and of each matrix's panels), so a damaged, truncated or
// foreign file is never used: it is reported and written again. The digests
// catch damage, not forgery: the cache directory is trusted as the binary
// is (whoever can write there can change outputs).
// Mapped MAP_SHARED: the file must only ever be replaced (rename), never
// truncated in place, or its readers get SIGBUS.
//
// Format (little-endian; the header is padded to a multiple of 4096 bytes,
// then the panels as Model::panel_layout() places them, to the file's end):
//   "ENCPANEL", u32 format (kPanelFileFormat), u32 panel layout
//   (kernels::kPanelLayout), u32 canonical order, u32 matrices N,
//   u64 header bytes, u64 panel bytes, 32 bytes model fingerprint (hex),
//   u64 model size, i64 model mtime (ns), u32 path length, the model's
//   absolute path (what `encore cache gc` checks),
//   N x (u32 type, u32 0, u64 rows, u64 cols, u64 offset, u64 bytes,
//        u64 XXH3-64 of those panel bytes),
//   u64 XXH3-64 of every header byte before it.
// Thread-safety: the functions are reentrant; two processes writing the
// same file at once each rename a complete one into place.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "encore/model.h"

namespace encore {

class ThreadPool;

inline constexpr uint32_t kPanelFileFormat = 1;

// Where a panel file came from (its key and what gc checks).
struct PanelFileOrigin {
  std::string model_fingerprint;  // 32 hex digits (model_fingerprint())
  std::string model_path;         // absolute
  uint64_t model_size = 0;
  int64_t model_mtime_ns = 0;
};

// The default directory of panel files: util::cache_dir()/panels ("" when
// there is no cache directory).
std::string default_panel_cache_dir();

// "FINGERPRINT-lLAYOUT-oORDER.panels"
std::string panel_file_name(const std::string& model_fingerprint);

// The header of a panel file as read (no check against a model).
struct PanelFileHeader {
  PanelFileOrigin origin;
  uint32_t format = 0, layout = 0, order = 0;
  uint64_t header_bytes = 0, panel_bytes = 0;
  struct Matrix {
    Model::PanelMatrix m;
    uint64_t digest = 0;
  };
  std::vector<Matrix> matrices;
};

// The parser of read_panel_file_header, on the first bytes of a file of
// `file_bytes` bytes (at least its header_bytes, or "short header" comes
// back). verify_digest=false skips the header digest (for the fuzzer, to
// reach the checks behind it). Pure; never throws for bad content.
std::optional<PanelFileHeader> decode_panel_file_header(std::string_view bytes, uint64_t file_bytes,
                                                        std::string* why,
                                                        bool verify_digest = true);
// The header of a file holding `h.matrices`, digest and padding included
// (h.header_bytes and the versions are computed, not read).
std::string encode_panel_file_header(const PanelFileHeader& h);

// Reads and checks the header of `path` (magic, versions, sizes against the
// file's, the header digest). nullopt with *why set when it is not a panel
// file of this build's layout, and *unreadable (if given) true when the file
// could not be opened or read (its content unknown); never throws.
std::optional<PanelFileHeader> read_panel_file_header(const std::string& path, std::string* why,
                                                      bool* unreadable = nullptr);

// What use_panel_cache did.
struct PanelCacheUse {
  bool hit = false;      // a good file was found and mapped
  bool written = false;  // the file was (re)written, then mapped
  // Why a file found was not used (then it was written again), or why none
  // could be written (then the panels stay in memory); "" otherwise.
  std::string problem;
};

// The model's panels from the cache file at `path`: mapped read-only when it
// holds this model's panels, checked; otherwise repacked
// (model.repack_weights(pool, release)), written to `path` and mapped. When
// the file cannot be written, the repacked panels stay in memory (and
// `problem` says why). Throws ModelError only where repack_weights does.
PanelCacheUse use_panel_cache(Model& model, ThreadPool& pool, const std::string& path,
                              const PanelFileOrigin& origin,
                              const std::function<void(std::span<const uint8_t>)>& release);

// Panel files under `dir` (only names panel_file_name gives) that `encore
// cache gc` removes: damaged, not of this build's format, layout or
// canonical order, or of a model that is no longer at its path or has
// changed (size or mtime); also temporary files of interrupted writes older
// than 10 minutes. A file that cannot be read now is left. Returns (path,
// reason) pairs; removes them unless dry_run.
std::vector<std::pair<std::string, std::string>> collect_panel_garbage(const std::string& dir,
                                                                       bool dry_run);

}  // namespace encore
