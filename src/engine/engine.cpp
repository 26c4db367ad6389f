// The Engine: opening a model, the scheduler thread, request handles.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "encore/chat_template.h"
#include "encore/error.h"
#include "encore/fingerprint.h"
#include "encore/gguf.h"
#include "encore/seed.h"
#include "engine/engine_impl.h"
#include "model/panel_file.h"
#include "util/text.h"

namespace encore {
namespace {

constexpr int32_t kDefaultMaxCtx = 4096;

// A number from a one-line file such as /sys/fs/cgroup/memory.max; nullopt
// when absent or not a number ("max").
std::optional<uint64_t> read_number(const char* path) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

// Memory this process may still use: MemAvailable from /proc/meminfo (else
// free physical pages), and no more than the cgroup (container) limit
// leaves.
uint64_t available_memory() {
  uint64_t avail = 0;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kib = 0;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") avail = kib * 1024;
  }
  if (avail == 0) {
    const long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
    if (pages > 0 && size > 0) avail = static_cast<uint64_t>(pages) * static_cast<uint64_t>(size);
  }
  const std::optional<uint64_t> limit = read_number("/sys/fs/cgroup/memory.max");
  const std::optional<uint64_t> used = read_number("/sys/fs/cgroup/memory.current");
  if (limit && used) avail = std::min(avail, *limit > *used ? *limit - *used : 0);
  return avail;
}

void add_persist_counters(EngineStats& s, const PersistCounters& p) {
  s.blocks_restored = p.blocks_restored;
  s.blocks_restored_disk = p.restored_from[0];
  s.blocks_restored_redis = p.restored_from[1];
  s.blocks_saved = p.blocks_saved;
  s.sessions_saved = p.sessions_saved;
  s.sessions_loaded = p.sessions_loaded;
  s.state_fallbacks = p.block_fallbacks + p.session_fallbacks;
  s.state_write_errors = p.write_errors;
  s.state_bytes_pending = p.bytes_pending;
}

int default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

// The state tiers the options name (the directory first, then Redis), or
// null when they name none.
std::unique_ptr<Persistence> open_state_tiers(const EngineOptions& options,
                                              const std::string& system_fp, KvBlockPool& pool) {
  if (options.state_dir.empty() && options.redis_url.empty()) return nullptr;
  if (!options.prefix_cache) {
    throw InvalidArgument("state tiers need the prefix cache (blocks are shared through it)");
  }
  std::vector<std::unique_ptr<StoreTier>> tiers;
  if (!options.state_dir.empty()) {
    DiskStoreOptions d;
    d.dir = options.state_dir;
    d.max_bytes = options.state_max_bytes;
    d.shares = options.tenant_shares;
    d.log = options.log;
    tiers.push_back(open_disk_store(d));
  }
  if (!options.redis_url.empty()) {
    RedisStoreOptions r;
    r.url = options.redis_url;
    r.shares = options.tenant_shares;
    r.log = options.log;
    tiers.push_back(open_redis_store(r));
  }
  return std::make_unique<Persistence>(std::make_unique<TieredStore>(std::move(tiers)), system_fp,
                                       pool, options.state_ttl, options.log);
}

}  // namespace

void EngineOptions::validate() const {
  if (threads != 0) settings::check(settings::kThreads, threads);  // 0: every core
  settings::check(settings::kCtxSize, n_ctx);
  settings::check(settings::kBatchTokens, batch_tokens);
  if (kv_type != DType::F16 && kv_type != DType::F32) {
    throw InvalidArgument("kv_type", fmt::format("{} must be F16 or F32", dtype_name(kv_type)));
  }
  if (!seed_secret.empty() &&
      (seed_secret.size() < kMinSeedSecretBytes || seed_secret.size() > kMaxSeedSecretBytes)) {
    throw InvalidArgument(
        "seed_secret", fmt::format("{} bytes; a derivation secret has {} to {}", seed_secret.size(),
                                   kMinSeedSecretBytes, kMaxSeedSecretBytes));
  }
  if (!(kv_ram_fraction > 0 && kv_ram_fraction <= 1)) {
    throw InvalidArgument("kv_ram_fraction", fmt::format("{} must be in (0, 1]", kv_ram_fraction));
  }
  if (!state_dir.empty() || !redis_url.empty()) {
    settings::check(settings::kStateMaxMib, static_cast<double>(state_max_bytes) / 1048576.0);
  }
  for (const auto& [tenant, bytes] : tenant_shares.bytes) {
    if (tenant.size() > kMaxTenantBytes || bytes == 0) {
      throw InvalidArgument(
          "tenant_shares",
          fmt::format("'{}': {} bytes; a share needs a tenant of at most {} bytes and at least "
                      "one byte (leave a tenant out for the default)",
                      tenant.substr(0, 64), bytes, kMaxTenantBytes));
    }
  }
}

// ---- Opening ---------------------------------------------------------------------

std::unique_ptr<Engine> Engine::open(const EngineOptions& options) {
  options.validate();
  const auto start = std::chrono::steady_clock::now();
  auto file = std::make_shared<gguf::File>(gguf::File::open(
      options.model_path, options.mmap ? gguf::LoadMode::Mmap : gguf::LoadMode::Read));
  const double read_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  gguf::File* owned = file.get();
  std::unique_ptr<Engine> engine = open_file(std::move(file), owned, options);
  engine->impl_->info.load_seconds += read_seconds;  // the thread never writes info
  return engine;
}

// The model's matrices repacked into panels (src/kernels/panel.h, float_panel.h):
// with mmap, mapped from the panel cache file that the host's processes
// share; else in memory. An engine that is its File's only user releases the
// file's copy of what it repacked, so the weights are held once.
void open_weights(Engine::Impl& m, const std::string& model_fp, gguf::File* owned) {
  EngineInfo& info = m.info;
  std::function<void(std::span<const uint8_t>)> release;
  if (owned != nullptr) release = [owned](std::span<const uint8_t> b) { owned->release(b); };
  const auto say = [&m](const std::string& line) {
    if (m.options.log) m.options.log(line);
  };
  const std::string dir =
      m.options.panel_cache_dir.empty() ? default_panel_cache_dir() : m.options.panel_cache_dir;
  const std::optional<gguf::FileStamp>& stamp = m.file->stamp();
  if (m.file->load_mode() == gguf::LoadMode::Mmap && m.model->panel_block_bytes() > 0) {
    std::error_code ec;
    const std::string abs_path = std::filesystem::absolute(m.file->path(), ec).string();
    if (dir.empty() || !stamp || ec) {
      say(fmt::format("{}: no panel cache ({}): the repacked weights are held in memory",
                      m.file->path(),
                      dir.empty() ? "no cache directory: set XDG_CACHE_HOME or HOME"
                                  : "the model file has no stable identity"));
      m.model->repack_weights(*m.threads, release);
    } else {
      const PanelFileOrigin origin{model_fp, abs_path, stamp->size, stamp->mtime_ns};
      const std::string path = dir + "/" + panel_file_name(model_fp);
      const PanelCacheUse use = use_panel_cache(*m.model, *m.threads, path, origin, release);
      if (!use.problem.empty()) say(use.problem);
      if (use.hit || use.written) {
        info.panels = use.hit ? "panel cache hit" : "panel cache written";
        info.panel_file = path;
      }
    }
  } else {
    m.model->repack_weights(*m.threads, release);
  }
  if (info.panels.empty() && m.model->repacked_bytes() > 0) info.panels = "memory";
  info.panel_bytes = m.model->repacked_bytes();
  info.released_bytes = owned != nullptr ? owned->released_bytes() : 0;
}

// The Jinja chat template: --chat-template-file's text, else the model's.
// A file's that does not parse fails the open (its user asked for it); the
// model's fails only the chat requests that need it (a plain prompt or a
// named family never does).
void open_chat_template(Engine::Impl& m, const std::string& name) {
  std::string text = m.options.chat_template_text;
  m.chat_jinja_origin = "file";
  if (text.empty()) {
    text = m.file->opt_string("tokenizer.chat_template").value_or("");
    m.chat_jinja_origin = "model";
  }
  if (text.empty()) return;
  m.chat_jinja_hash = sha256_hex(text);
  try {
    m.chat_jinja = std::make_shared<const jinja::Template>(text);
  } catch (const InvalidArgument& e) {
    if (m.chat_jinja_origin == "file") {
      throw InvalidArgument("chat_template_file",
                            fmt::format("{}: {}", m.options.chat_template_origin, e.what()));
    }
    m.chat_jinja_error = fmt::format("{}: tokenizer.chat_template: {}", name, e.what());
    try {
      const ChatTemplate family = detect_chat_template(text);
      m.chat_jinja_error +=
          fmt::format(" (it resembles the family '{}')", chat_template_name(family));
    } catch (const InvalidArgument&) {
    }
  }
}

std::unique_ptr<Engine> Engine::open(std::shared_ptr<const gguf::File> file,
                                     const EngineOptions& options) {
  if (file != nullptr && file->released_bytes() > 0) {
    throw std::logic_error(fmt::format(
        "{}: this File gave back the bytes of its repacked matrices (an engine opened it by "
        "path): open the model again",
        file->path()));
  }
  return open_file(std::move(file), nullptr, options);
}

std::unique_ptr<Engine> Engine::open_file(std::shared_ptr<const gguf::File> file, gguf::File* owned,
                                          const EngineOptions& options) {
  options.validate();
  const auto start = std::chrono::steady_clock::now();
  auto impl = std::make_unique<Impl>();
  Impl& m = *impl;
  m.options = options;
  m.file = std::move(file);
  const std::string name = options.model_path.empty() ? m.file->path() : options.model_path;
  m.model = Model::load(*m.file);
  m.tokenizer = Tokenizer::create(vocab_from_gguf(*m.file));
  open_chat_template(m, name);
  const HParams& hp = m.model->hparams();
  if (m.tokenizer->n_vocab() != hp.n_vocab) {
    throw ModelError(fmt::format("{}: the tokenizer has {} tokens but the model's vocabulary is {}",
                                 name, m.tokenizer->n_vocab(), hp.n_vocab));
  }
  const int32_t n_ctx =
      options.n_ctx > 0 ? options.n_ctx : std::min(hp.n_ctx_train, kDefaultMaxCtx);
  if (n_ctx < 1) throw ModelError(fmt::format("{}: the model's context length is 0", name));
  m.threads =
      std::make_unique<ThreadPool>(options.threads > 0 ? options.threads : default_threads());
  // The fingerprint first: it reads every tensor, and repacking may release
  // the file's copy of the matrices.
  bool fp_cached = false;
  const std::string model_fp =
      model_fingerprint_cached(*m.file, *m.threads, &fp_cached, options.fingerprint_cache_dir);
  EngineInfo& info = m.info;
  open_weights(m, model_fp, owned);
  const KvLayout layout = kv_layout_for(hp, options.kv_type);
  uint64_t kv_bytes = options.kv_bytes;
  if (kv_bytes == 0) {
    // Pages are committed as blocks are first written; with the prefix
    // cache a long-running engine ends up using the whole pool, so the
    // fraction is what it may take of the memory available now (after the
    // weights), leaving the rest of the machine usable.
    kv_bytes =
        static_cast<uint64_t>(static_cast<double>(available_memory()) * options.kv_ram_fraction);
    kv_bytes = std::max<uint64_t>(kv_bytes, kv_bytes_for_tokens(layout, n_ctx));
  }
  m.pool = std::make_unique<KvBlockPool>(layout, kv_bytes);
  m.ctx = std::make_unique<ForwardContext>(*m.model, *m.pool, *m.threads, n_ctx, options.isa);
  NumericsSettings numerics;
  numerics.kv_type = options.kv_type;
  numerics.rope_freq_base = hp.rope_freq_base;
  numerics.rope_freq_scale = hp.rope_freq_scale;
  for (const std::string& t : m.tokenizer->vocab().tokens) {
    m.max_token_bytes = std::max<uint64_t>(m.max_token_bytes, t.size());
  }

  info.model_path = name;
  info.arch = hp.arch;
  info.n_vocab = hp.n_vocab;
  info.n_ctx = n_ctx;
  info.n_ctx_train = hp.n_ctx_train;
  info.synthetic = m.file->opt_bool("encore.synthetic").value_or(false);
  info.mmap = m.file->load_mode() == gguf::LoadMode::Mmap;
  info.threads = m.threads->size();
  info.isa = m.ctx->isa();
  info.kv_type = options.kv_type;
  info.kv_blocks = m.pool->n_blocks();
  info.kv_block_tokens = layout.block_tokens;
  info.kv_block_bytes = layout.block_bytes();
  info.batch_tokens = options.batch_tokens;
  info.prefix_cache = options.prefix_cache;
  info.model_fingerprint = model_fp;
  info.model_fingerprint_cached = fp_cached;
  info.system_fingerprint = system_fingerprint(model_fp, numerics);
  info.numerics = numerics;
  info.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  m.persist = open_state_tiers(options, info.system_fingerprint, *m.pool);
  m.scheduler = std::make_unique<Scheduler>(*m.pool, hp.n_vocab, options.batch_tokens,
                                            options.prefix_cache, m.persist.get());
  m.runner = std::make_unique<Runner>(*m.ctx);
  m.output = std::make_unique<OutputProcessor>(*m.tokenizer, n_ctx, m.ctx->isa(), m.persist.get(),
                                               !options.async_session_writes);
  m.publish_stats();
  std::unique_ptr<Engine> engine(new Engine(std::move(impl)));
  m.thread = std::thread([&m] { m.loop(); });  // after: a throw above must not leave it running
  return engine;
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

// ---- The scheduler thread -------------------------------------------------------------

void Engine::Impl::loop() {
  for (;;) {
    std::deque<std::unique_ptr<Job>> jobs;
    std::deque<std::function<void(bool)>> todo;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      wake.wait(lock,
                [&] { return stop || !incoming.empty() || !tasks.empty() || !scheduler->idle(); });
      stopping = stop;
      jobs.swap(incoming);
      todo.swap(tasks);
    }
    for (auto& job : jobs) {
      if (job->nothing_to_generate()) {
        output->finish_at_once(*job);
      } else {
        scheduler->add(std::move(job));
      }
    }
    if (stopping) {
      end_all(Response::Status::Cancelled, {});
      for (auto& task : todo) task(true);
      publish_stats();
      idle_cv.notify_all();
      return;
    }
    for (auto& task : todo) task(false);
    try {
      step();
    } catch (const std::exception& e) {
      // A bug or out of memory outside any one request's step: end every
      // request with the error rather than the process.
      end_all(Response::Status::Failed, fmt::format("the engine's scheduler failed: {}", e.what()));
    }
    publish_stats();
    {
      std::lock_guard<std::mutex> lock(mu);
      idle = scheduler->idle() && incoming.empty();
    }
    idle_cv.notify_all();
  }
}

void Engine::Impl::step() {
  const StepPlan& plan = scheduler->schedule();
  KvReleases releases;
  output->end(plan, releases);
  if (!plan.empty()) {
    bool ran = true;
    try {
      runner->execute(plan);
    } catch (const std::exception& e) {
      // The requests of this step end with the error; the others go on.
      output->fail(plan, fmt::format("forward step failed: {}", e.what()), releases);
      ran = false;
    }
    if (ran) {
      scheduler->after_step(plan);
      output->process(plan, releases);
    }
  }
  scheduler->update(releases);
}

void Engine::Impl::end_all(Response::Status status, const std::string& error) {
  KvReleases none;  // take_all freed the KV
  for (const auto& job : scheduler->take_all()) output->complete(*job, status, error, none);
}

void Engine::Impl::publish_stats() {
  EngineStats s = scheduler->counters();
  const EngineStats& o = output->counters();
  s.tokens_generated = o.tokens_generated;
  s.requests_finished = o.requests_finished;
  s.requests_cancelled = o.requests_cancelled;
  s.requests_failed = o.requests_failed;
  s.requests_submitted = submitted.load();
  s.seeds_drawn = seeds_drawn.load();
  s.seeds_derived = seeds_derived.load();
  s.seeds_session = seeds_session.load();
  s.seeds_reused = seeds_reused.load();
  s.prefix_evictions = pool->evictions();
  s.kv_blocks_total = pool->n_blocks();
  s.kv_blocks_used = pool->n_used();
  s.kv_blocks_cached = pool->n_evictable();
  s.kv_blocks_free = pool->n_unused();
  std::lock_guard<std::mutex> lock(stats_mu);
  stats = s;
}

void Engine::Impl::run_exclusive(const std::function<void()>& fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> result = done->get_future();
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stop) throw InvalidArgument("the engine is shutting down");
    tasks.push_back([fn, done](bool stopping) {
      if (stopping) {
        done->set_exception(std::make_exception_ptr(InvalidArgument("the engine stopped")));
        return;
      }
      try {
        fn();
        done->set_value();
      } catch (...) {
        done->set_exception(std::current_exception());
      }
    });
  }
  wake.notify_all();
  result.get();
}

// ---- Front door --------------------------------------------------------------------------

RequestHandle Engine::submit(Request request) {
  std::unique_ptr<Job> job = impl_->make_job(std::move(request));
  std::shared_ptr<RequestShared> shared = job->shared;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (impl_->stop) throw InvalidArgument("the engine is shutting down");
    job->order = impl_->next_order++;
    ++impl_->submitted;
    impl_->incoming.push_back(std::move(job));
    impl_->idle = false;
  }
  impl_->wake.notify_all();
  return RequestHandle(std::move(shared));
}

Response Engine::run(Request request) {
  RequestHandle h = submit(std::move(request));
  return h.wait();
}

void Engine::drain() {
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    impl_->idle_cv.wait(lock,
                        [&] { return impl_->stop || (impl_->idle && impl_->incoming.empty()); });
  }
  if (impl_->persist) impl_->persist->flush();  // what the last requests wrote is stored now
}

namespace {

Persistence& persistence_of(Engine::Impl& m, const std::string& session) {
  if (!m.persist) throw InvalidArgument("session", "this engine has no state tiers");
  if (!valid_session_id(session)) {
    throw InvalidArgument("session", fmt::format("'{}' is not a session id (one is {})",
                                                 util::printable(session, 64), kSessionIdRule));
  }
  return *m.persist;
}

}  // namespace

std::optional<RunState> Engine::load_session(const std::string& tenant, const std::string& session,
                                             std::string* absent) {
  SessionLoad l = persistence_of(*impl_, session).load_session(tenant, session, false);
  if (!l.state && absent) *absent = l.why(session);
  return std::move(l.state);
}

void Engine::save_session(const std::string& tenant, const std::string& session,
                          const RunState& state) {
  Persistence& p = persistence_of(*impl_, session);
  RunState s = state;
  if (s.generation == 0) {  // newer than the record it replaces (load_session compares them)
    const SessionLoad l = p.load_session(tenant, session, false);
    s.generation = l.state ? l.state->generation + 1 : 1;
    if (l.state && !s.session_seed) {
      s.session_seed = l.state->session_seed;
      s.turns = l.state->turns;
    }
  }
  p.save_session(tenant, session, std::move(s));
}

std::vector<std::pair<std::string, StoreCounters>> Engine::state_counters() const {
  if (!impl_->persist) return {};
  return impl_->persist->tier_counters();
}

const EngineInfo& Engine::info() const { return impl_->info; }

EngineStats Engine::stats() const {
  EngineStats s;
  {
    std::lock_guard<std::mutex> lock(impl_->stats_mu);
    s = impl_->stats;
  }
  // The writer thread moves these between steps: read them now, not as of
  // the last step.
  if (impl_->persist) add_persist_counters(s, impl_->persist->counters());
  return s;
}

std::vector<TokenId> Engine::tokenize(std::string_view text) const {
  return impl_->tokenizer->encode(text, Tokenizer::EncodeOptions{});
}

// ---- Handles --------------------------------------------------------------------------------

// What the scheduler thread hands over (job.h): the handle below takes it.
void RequestShared::push(Event e) {
  {
    std::lock_guard<std::mutex> lock(mu);
    events.push_back(std::move(e));
  }
  cv.notify_all();
}

void RequestShared::finish(Response r) {
  {
    std::lock_guard<std::mutex> lock(mu);
    response = std::move(r);
    if (stream) {
      Event e;
      e.kind = Event::Kind::Done;
      events.push_back(std::move(e));
    }
    done = true;
  }
  cv.notify_all();
}

RequestHandle::RequestHandle(std::shared_ptr<RequestShared> shared) : shared_(std::move(shared)) {}
RequestHandle::RequestHandle(RequestHandle&&) noexcept = default;

RequestHandle& RequestHandle::operator=(RequestHandle&& other) noexcept {
  if (this != &other) {
    if (shared_) shared_->cancel = true;
    shared_ = std::move(other.shared_);
  }
  return *this;
}

RequestHandle::~RequestHandle() {
  if (shared_) shared_->cancel = true;  // no effect once it is over
}

namespace {

RequestShared& shared_of(const std::shared_ptr<RequestShared>& shared) {
  if (!shared) throw std::logic_error("RequestHandle: empty (default-constructed or moved from)");
  return *shared;
}

std::optional<Event> pop_event(RequestShared& s) {
  if (s.events.empty()) return std::nullopt;
  Event e = std::move(s.events.front());
  s.events.pop_front();
  return e;
}

}  // namespace

const Response& RequestHandle::wait() {
  RequestShared& s = shared_of(shared_);
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait(lock, [&] { return s.done; });
  return s.response;
}

std::optional<Event> RequestHandle::next() {
  RequestShared& s = shared_of(shared_);
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait(lock, [&] { return !s.events.empty() || s.done; });
  return pop_event(s);
}

std::optional<Event> RequestHandle::next_for(std::chrono::milliseconds timeout) {
  RequestShared& s = shared_of(shared_);
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait_for(lock, timeout, [&] { return !s.events.empty() || s.done; });
  return pop_event(s);
}

void RequestHandle::cancel() {
  if (shared_) shared_->cancel = true;
}

uint64_t RequestHandle::seed() const { return shared_of(shared_).seed; }
bool RequestHandle::session_found() const { return shared_of(shared_).session_found; }

bool RequestHandle::done() const {
  if (!shared_) return true;
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->done;
}

}  // namespace encore
