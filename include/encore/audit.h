// The audit log: one JSON line per finished request, chained by SHA-256 so
// that an edited, deleted, reordered or truncated line is found
// (docs/audit.md); its verification; and its replay, which re-executes every
// logged request and compares the outputs bit for bit.
//
// Line format (one JSON object, "\n"-terminated, fields in this order):
//   {"seq":N,"type":T, ...the record...,"prev":P,"hash":H}
// seq counts every line of the log from 1, across restarts and rotated
// files; P is the previous line's H (64 zeros before the first line); H is
// the SHA-256 (lowercase hex) of the line's bytes up to and including P's
// closing quote, followed by "}" — the line as it would read without its
// hash. Types: "start" (a writer opened the log), "request" (a finished
// request), "check" (a consistency check's result, server.h), "recover"
// (the writer found a torn last line after a crash and wrote this after it).
//
// Ownership and threads: an AuditLog owns its file and one writer thread;
// append() may be called from any thread and never waits for the disk
// (only, as back-pressure, while kMaxQueueBytes are queued). The other
// functions are pure or own what they open.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "encore/engine.h"
#include "encore/request.h"
#include "encore/seed.h"

namespace encore::audit {

using Json = nlohmann::ordered_json;

// When the writer makes the lines it wrote durable (fdatasync): after each
// batch of lines it takes from the queue, at most once a second, or when
// the OS decides. A request's answer never waits for its line.
enum class Fsync { Always, Interval, Never };
// "always", "interval", "never"; from_name throws InvalidArgument.
const char* fsync_name(Fsync f);
Fsync fsync_from_name(std::string_view name);

struct AuditOptions {
  std::string path;  // "" = no audit log
  Fsync fsync = Fsync::Interval;
  // The live file is renamed to PATH.N (N = 1, 2, ...) before a line would
  // take it past this size, and a new PATH continues the chain. 0: never.
  uint64_t max_bytes = 256ull << 20;
  // Hashes instead of the prompt's and the outputs' ids and text
  // (docs/audit.md: a replay then takes them from --inputs).
  bool redact = false;
};

inline constexpr size_t kMaxLineBytes = 16u << 20;   // a longer line is not an audit line
inline constexpr size_t kMaxQueueBytes = 64u << 20;  // append() waits while this is queued
// How long append() waits for room before it drops the record (counted).
inline constexpr std::chrono::seconds kMaxQueueWait{30};
inline constexpr const char* kGenesis =  // "prev" of the first line
    "0000000000000000000000000000000000000000000000000000000000000000";

// SHA-256 of `bytes`, 64 lowercase hex digits (seed.h); of token ids, over
// their little-endian int32 bytes.
using encore::sha256_hex;
std::string ids_sha256(const std::vector<TokenId>& ids);

// ---- records ---------------------------------------------------------------

// How a request ended, as its line says: "completed" (answered in full),
// "cancelled" (the client went away or it timed out: outputs are what was
// generated until then), "stopped" (the server cancelled it at shutdown),
// "failed" (the engine failed it), "rejected" (refused before it ran: a bad
// request).
struct Ending {
  std::string status;
  std::string error;    // what and why, when not completed
  int http_status = 0;  // the status the server counted it under; 0 off HTTP
};

// The "request" record of a finished request. `response` is null for one
// refused before it ran. The engine's fingerprint parts come from `info`.
Json request_record(std::string_view id, std::string_view endpoint, std::string_view tenant,
                    const Ending& ending, const Response* response, const EngineInfo& info,
                    bool redact);

// The hash of the sample states a session continuation resumed from (the
// run state's "samples" JSON, SHA-256).
std::string states_hash(const std::vector<SampleState>& states);

// ---- writing -----------------------------------------------------------------

struct WriterCounters {
  int64_t lines = 0;          // written
  int64_t bytes_pending = 0;  // queued or being written
  int64_t write_errors = 0;   // failed writes and rotations (retried)
  int64_t rotations = 0;
  int64_t dropped = 0;  // records never written: the writer was stuck kMaxQueueWait, or closing
};

class AuditLog {
 public:
  // Opens (creating) options.path and continues the chain of what it holds
  // (or of the newest rotated PATH.N when PATH is empty or absent): a torn
  // last line left by a crash gets a "recover" line after it; then a
  // "start" line is written. Throws InvalidArgument when the path cannot be
  // written, or when the last complete line does not match its hash (the
  // file was edited: `encore audit verify` says where; move it away to
  // start a new log), or when another process holds the file (a lock).
  // `log` takes one line per remark (write errors and their end);
  // thread-safe; may be empty.
  static std::unique_ptr<AuditLog> open(const AuditOptions& options,
                                        std::function<void(std::string_view)> log = {});
  // Writes what is queued and stops the writer.
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  // Queues one record (a JSON object with members, else InvalidArgument;
  // seq, prev and hash are added when it is written, in the order of the
  // calls). Waits only while kMaxQueueBytes are queued, at most
  // kMaxQueueWait: then the record is dropped (counted, said).
  void append(Json record);
  // Blocks until every line queued before the call is written and, unless
  // fsync is Never, durable; false when `timeout` passed first (a failing
  // disk: the writer keeps retrying).
  bool flush(std::chrono::milliseconds timeout = std::chrono::seconds(30));
  WriterCounters counters() const;
  const AuditOptions& options() const { return options_; }

  struct Impl;  // src/audit/writer.cpp

 private:
  AuditLog(const AuditOptions& options, std::unique_ptr<Impl> impl);
  AuditOptions options_;
  std::unique_ptr<Impl> impl_;
};

// ---- reading -----------------------------------------------------------------

// One verified line.
struct Line {
  std::string file;
  int64_t line_no = 0;  // 1-based, in its file
  int64_t seq = 0;
  Json json;
};

struct VerifyReport {
  int64_t lines = 0;  // lines verified (before the break, if any)
  int64_t first_seq = 0, last_seq = 0;
  std::string head;                // the hash of the last verified line: anchor it elsewhere
  std::vector<std::string> files;  // in chain order
  std::vector<std::string> notes;  // not breaks: the chain starts past seq 1, torn lines
  // The first broken link: "FILE:LINE: why" (edited, deleted, reordered,
  // truncated, not an audit line); empty when the chain holds.
  std::string broken;
  bool ok() const { return broken.empty(); }
};

// Checks the chain over `files` (any order: they are put in chain order by
// their first seq), calling `each` (if given) with every verified line, in
// order, up to the break. Reads every file once, a line at a time (lines
// over kMaxLineBytes are breaks, never held). A torn last line of the last
// file is a note (a crash while writing), not a break. Throws
// InvalidArgument for a file that cannot be read.
VerifyReport verify(const std::vector<std::string>& files,
                    const std::function<void(const Line&)>& each = {});

// ---- replay ------------------------------------------------------------------

struct ReplayOptions {
  std::vector<std::string> files;
  std::string from_id, to_id;  // "" = from the first / to the last request line
  std::optional<std::string> tenant;
  // Unredacted lines (the audit log's own shape: "id" and request.prompt.ids,
  // optionally choices[].ids) supplying what a redacted log keeps as hashes.
  std::string inputs;
  int window = 64;                                            // requests in flight at once
  std::function<void(int64_t done, int64_t total)> progress;  // may be empty
};

// One request line's outcome.
struct ReplayResult {
  std::string id;
  std::string tenant;
  std::string verdict;  // "identical", "differs", "skipped"
  std::string detail;   // differs: where and what; skipped: why; identical: what was compared
  int64_t seq = 0;
};

struct ReplaySummary {
  VerifyReport chain;
  std::vector<ReplayResult> results;  // in log order
  int64_t identical = 0, differs = 0, skipped = 0;
  std::string engine_note;  // e.g. the build differs from the log's
};

// Verifies the chain, then re-executes every request line (up to the break)
// of the selected range through `engine`, in log order, `window` at a time;
// a session continuation waits for the turn it continues. `engine` must run
// the log's context size (its lines with another are skipped, saying so).
// `token_text` (may be empty) gives the text of one id for the differs
// detail.
ReplaySummary replay(Engine& engine, const ReplayOptions& options,
                     const std::function<std::string(TokenId)>& token_text);

// The context size and KV type of the first request line of `files` in
// chain order (what replay's engine should be opened with); nullopt when
// there is none.
struct LoggedNumerics {
  int32_t n_ctx = 0;
  std::string kv_type;
};
std::optional<LoggedNumerics> first_numerics(const std::vector<std::string>& files);

}  // namespace encore::audit
