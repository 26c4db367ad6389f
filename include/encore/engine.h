// The front door: one Engine per model, shared by every front end.
//
// An Engine opens a model once (weights, tokenizer, content fingerprint, KV
// block pool, thread pool, kernels) and serves Requests (request.h) from any
// thread. A scheduler thread runs iteration-level continuous batching: each
// forward step takes one decode token of every running sample plus prefill
// chunks of waiting requests, up to a token budget; requests are admitted
// first come, first served (by priority) while KV blocks last, and when
// blocks run out the newest request is preempted (its KV freed; it is
// recomputed later). Full KV blocks are content-addressed (a hash chain over
// the token ids, salted by the system fingerprint and the tenant) and shared
// between requests with the same prefix; blocks nobody uses stay cached until
// the pool needs them (least recently used first).
//
// None of this changes a bit of output (request.h, docs/invariance.md): a
// request's ids and logprobs are the same alone or in a crowd, preempted or
// not, from the prefix cache or computed cold.
//
// Ownership: the Engine owns everything it opened and its scheduler thread;
// the destructor cancels what is still running and joins the thread. A
// RequestHandle shares one request's state with the engine; dropping it
// cancels the request.
// Thread-safety: every public method may be called from any thread.
// Cost: submit() tokenizes and validates on the caller's thread (O(prompt));
// the work happens on the scheduler thread and its thread pool.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "encore/dtype.h"
#include "encore/fingerprint.h"
#include "encore/isa.h"
#include "encore/request.h"
#include "encore/run_state.h"
#include "encore/store.h"

namespace encore {

namespace gguf {
class File;
}

struct EngineOptions {
  std::string model_path;
  bool mmap = false;           // map the weights instead of reading them into memory
  int threads = 0;             // 0: every core
  int32_t n_ctx = 0;           // positions per sequence; 0: the model's, at most 4096
  DType kv_type = DType::F16;  // F16 or F32: part of the numerics (system fingerprint)
  // KV cache budget in bytes; 0: kv_ram_fraction of the memory available
  // after loading (MemAvailable). Only address space until blocks are used.
  uint64_t kv_bytes = 0;
  double kv_ram_fraction = 0.8;
  int32_t batch_tokens = 512;  // tokens per forward step (decodes + prefill chunks)
  std::optional<Isa> isa;      // default: ENCORE_ISA, else the best the CPU has
  bool prefix_cache = true;
  std::string fingerprint_cache_dir;  // "" = fingerprint_cache_dir() (fingerprint.h)
  // With mmap: the directory of panel cache files (src/model/panel_file.h),
  // the repacked weights mapped read-only and shared by every process on
  // the host; "" = util::cache_dir()/panels. Without a cache directory the
  // panels are held in memory (and the log says so).
  std::string panel_cache_dir;
  // A request without a seed gets derive_seed(seed_secret, tenant, prompt
  // ids) (seed.h): the same input, the same seed, unpredictable without the
  // secret. "" draws it from the OS instead. kMinSeedSecretBytes to
  // kMaxSeedSecretBytes (seed.h).
  std::string seed_secret;

  // The Jinja chat template (jinja.h) that renders `messages` when a request
  // names no family: this text (--chat-template-file) if not empty, else the
  // model's tokenizer.chat_template. chat_template_origin names it in
  // messages (the file's path). A text that does not parse fails the open;
  // a model's that does not fails only the chat requests that need it.
  std::string chat_template_text;
  std::string chat_template_origin;
  // strftime_now's clock in chat templates, seconds since 1970 (UTC);
  // nullopt: the system clock at each render. The rendered prompt is what
  // the audit log records and a replay evaluates, so a replay never depends
  // on it.
  std::optional<int64_t> template_now;

  // State tiers (store.h) for sessions and KV snapshots; none when both are
  // empty. They need the prefix cache.
  std::string state_dir;  // a local directory (default_state_dir() is the usual one)
  std::string redis_url;  // redis://host:port[/db]
  uint64_t state_max_bytes = 8ull << 30;   // size cap of the directory
  std::chrono::milliseconds state_ttl{0};  // records expire after this (0: never)
  // A session's answer ends (RequestHandle::wait returns, a stream's last
  // event comes) only once its record and KV blocks are written to the
  // tiers, so a process that dies after answering loses no turn. true: the
  // answer comes first and the write follows within milliseconds.
  bool async_session_writes = false;  // settings::kAsyncSessionWrites
  // Each tenant's share of each tier (store.h, TenantShares): a tenant with
  // one keeps its sessions and KV blocks within it (its own least recently
  // used records go first; a record larger than the share is not stored,
  // counted as a write error), whatever the other tenants write. Keyed by
  // Request::tenant; default_bytes applies to every tenant not named (0:
  // none, bounded only by state_max_bytes, which takes from such tenants
  // first, and by Redis' own memory limit). For full isolation keep the
  // shares' sum under state_max_bytes and Redis' maxmemory.
  TenantShares tenant_shares;
  // One line per remark about persistent state (a record ignored and why, a
  // Redis outage and its end, a panel cache file not used or not written). Called from the
  // scheduler, writer and submitting threads: it must be thread-safe. Default: none.
  std::function<void(std::string_view)> log;

  // Throws InvalidArgument naming the option.
  void validate() const;
};

// What the engine opened; fixed for its lifetime.
struct EngineInfo {
  std::string model_path;
  std::string arch;
  int n_vocab = 0;
  int32_t n_ctx = 0;
  int32_t n_ctx_train = 0;
  bool synthetic = false;  // made by `encore synth`: random weights
  bool mmap = false;
  int threads = 0;
  Isa isa = Isa::Scalar;
  DType kv_type = DType::F16;
  int32_t kv_blocks = 0;
  int32_t kv_block_tokens = 0;
  uint64_t kv_block_bytes = 0;
  int32_t batch_tokens = 0;
  bool prefix_cache = true;
  std::string model_fingerprint;
  bool model_fingerprint_cached = false;  // read from the fingerprint cache
  std::string system_fingerprint;
  NumericsSettings numerics;  // what the system fingerprint covers besides the model and build
  double load_seconds = 0;
  // Where the repacked weights live: "memory", "panel cache hit", "panel
  // cache written" (both mapped from panel_file), or "" where nothing was
  // repacked (a model without weight matrices of a repacked type).
  std::string panels;
  std::string panel_file;       // the panel cache file used, if any
  uint64_t panel_bytes = 0;     // the repacked weights' size
  uint64_t released_bytes = 0;  // bytes of the model file given back once repacked
};

// Counters since the engine started, and the pool's state now.
struct EngineStats {
  int64_t requests_submitted = 0;
  int64_t requests_finished = 0;  // Ok
  int64_t requests_cancelled = 0;
  int64_t requests_failed = 0;
  int64_t requests_running = 0;  // admitted (holding KV or being prefilled)
  int64_t requests_waiting = 0;  // queued, preempted ones included
  int64_t steps = 0;             // forward steps
  int64_t tokens_evaluated = 0;  // tokens through the forward pass
  int64_t tokens_generated = 0;  // sampled tokens
  int64_t preemptions = 0;
  int64_t seeds_drawn = 0;    // requests without a seed: drawn from the OS
  int64_t seeds_derived = 0;  // requests without a seed: derived (EngineOptions::seed_secret)
  int64_t seeds_session = 0;  // new turns of a session without a seed (the session's seed)
  // Requests whose tenant gave a seed it gave with another prompt within its
  // last kSeedReuseWindow (seed, prompt) pairs (src/engine/seed_reuse.h).
  int64_t seeds_reused = 0;
  // Prefix cache: prompt walks, full blocks found, their tokens, cached blocks
  // taken back by the pool for other use.
  int64_t prefix_lookups = 0;
  int64_t prefix_hit_blocks = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prefix_evictions = 0;
  // Requests that restored KV blocks from the state tiers rather than
  // finding them in RAM or recomputing them (e.g. a session continued on
  // another replica).
  int64_t requests_restored = 0;
  // State tiers: blocks restored instead of recomputed (from the first tier,
  // the directory, and the second, Redis), blocks and sessions written,
  // records that did not match (recomputed), write errors.
  int64_t blocks_restored = 0;
  int64_t blocks_restored_disk = 0;
  int64_t blocks_restored_redis = 0;
  int64_t blocks_saved = 0;
  int64_t sessions_saved = 0;
  int64_t sessions_loaded = 0;
  int64_t state_fallbacks = 0;
  int64_t state_write_errors = 0;
  int64_t state_bytes_pending = 0;  // now: records queued for the tiers or being written
  // KV blocks now: referenced by a sequence, cached with no user (evictable),
  // never used or freed without content worth keeping.
  int32_t kv_blocks_total = 0;
  int32_t kv_blocks_used = 0;
  int32_t kv_blocks_cached = 0;
  int32_t kv_blocks_free = 0;
};

class Engine;
struct RequestShared;  // src/engine/job.h

// One submitted request. Move-only; dropping it cancels the request.
class RequestHandle {
 public:
  RequestHandle() = default;
  explicit RequestHandle(std::shared_ptr<RequestShared> shared);
  RequestHandle(RequestHandle&&) noexcept;
  RequestHandle& operator=(RequestHandle&&) noexcept;
  ~RequestHandle();

  // Blocks until the request is over; its Response (also after events were
  // taken with next()), valid while this handle holds the request. wait(),
  // next() and next_for() throw std::logic_error on an empty
  // (default-constructed or moved-from) handle, whose done() is true.
  const Response& wait();
  // Streaming (Request::stream): the next event, blocking; nullopt after
  // Done has been taken. With a timeout: nullopt also when none came in time.
  std::optional<Event> next();
  std::optional<Event> next_for(std::chrono::milliseconds timeout);
  // Asks the engine to stop the request and free its KV (within one step);
  // it ends with Status::Cancelled. No effect once it is over.
  void cancel();
  bool done() const;
  // The seed the request runs with (drawn at submission when it had none).
  uint64_t seed() const;
  // Whether Request::session named a saved session that is continued
  // (known at submission; Response::session_found).
  bool session_found() const;

 private:
  std::shared_ptr<RequestShared> shared_;
};

struct BenchOptions;  // bench.h
struct BenchReport;

class Engine {
 public:
  // Opens options.model_path. Throws GgufError / ModelError for a bad file,
  // InvalidArgument for bad options, ResourceExhausted when the KV pool cannot
  // be allocated.
  // The engine is its File's only user: read into memory, the file's bytes
  // of the matrices it repacks are given back (gguf::File::release).
  static std::unique_ptr<Engine> open(const EngineOptions& options);
  // The same over a File already open (tests, in-memory models); shared with
  // the caller, so nothing of it is given back. Throws std::logic_error for
  // a File that has given bytes back (released_bytes() > 0).
  static std::unique_ptr<Engine> open(std::shared_ptr<const gguf::File> file,
                                      const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates `request` (every field; the prompt must fit the context; the
  // request must fit the KV pool on its own, n samples to max_tokens or the
  // context each) and queues it. Throws InvalidArgument naming the field,
  // ResourceExhausted when it could never fit the KV budget, or NotFound
  // (error.h; message "session: ...") for a session continued without a
  // prompt when no usable session is saved under (tenant, session).
  RequestHandle submit(Request request);
  // submit() and wait().
  Response run(Request request);

  // Blocks until no request is queued or running (and stats() says so) and
  // what they saved is written to the state tiers.
  // Not to be called while the engine is being destroyed.
  void drain();

  const EngineInfo& info() const;
  // Counters and the pool's state as of the scheduler's last step; the state
  // tiers' counters as of now. Thread-safe.
  EngineStats stats() const;
  // The tokenizer's ids for `text` (no BOS, special tokens as text).
  std::vector<TokenId> tokenize(std::string_view text) const;
  // A saved session (its request, sample states and, for a chat, the
  // conversation with the last answer), or nullopt: none, or unusable; then
  // `absent` (if given) says which, in words (SessionLoad::why). Throws
  // InvalidArgument without state tiers or for a bad id.
  std::optional<RunState> load_session(const std::string& tenant, const std::string& session,
                                       std::string* absent = nullptr);
  // Queues `state` to be written as session (tenant, session). A state
  // without a generation (RunState) gets the saved record's + 1, and its
  // session seed and turns when it has none.
  void save_session(const std::string& tenant, const std::string& session, const RunState& state);
  // Per state tier (name, counters); empty without state tiers.
  std::vector<std::pair<std::string, StoreCounters>> state_counters() const;

  struct Impl;  // src/engine/engine_impl.h

 private:
  // The benchmark (bench.h) drives the forward pass between steps: it is
  // part of the engine, not a user of it.
  friend BenchReport run_bench(Engine& engine, const BenchOptions& options);

  explicit Engine(std::unique_ptr<Impl> impl);
  // open() over `file`; `owned` is the same File when the engine is its
  // only user (it may then release the bytes it has repacked), else null.
  static std::unique_ptr<Engine> open_file(std::shared_ptr<const gguf::File> file,
                                           gguf::File* owned, const EngineOptions& options);
  std::unique_ptr<Impl> impl_;
};

}  // namespace encore
