// The Engine: opening a model, the scheduler thread, request handles.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <future>
#include <limits>
#include <sstream>

#include "encore/error.h"
#include "encore/fingerprint.h"
#include "engine/engine_impl.h"

namespace encore {
namespace {

constexpr int32_t kDefaultMaxCtx = 4096;
constexpr int32_t kMaxCtx = 1 << 20;  // bounds the scratch buffers

// MemAvailable from /proc/meminfo (bytes), else free physical pages.
uint64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  const long pages = sysconf(_SC_AVPHYS_PAGES), size = sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(size) : 0;
}

int default_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

}  // namespace

void EngineOptions::validate() const {
  if (threads < 0 || threads > ThreadPool::kMaxThreads) {
    throw InvalidArgument(fmt::format("threads {} must be in [1, {}] (0: every core)", threads,
                                      ThreadPool::kMaxThreads));
  }
  if (n_ctx < 0 || n_ctx > kMaxCtx) {
    throw InvalidArgument(
        fmt::format("context size {} must be in [1, {}] (0: the model's)", n_ctx, kMaxCtx));
  }
  if (kv_type != DType::F16 && kv_type != DType::F32) {
    throw InvalidArgument(fmt::format("KV type {} must be F16 or F32", dtype_name(kv_type)));
  }
  if (!(kv_ram_fraction > 0 && kv_ram_fraction <= 1)) {
    throw InvalidArgument(fmt::format("KV memory fraction {} must be in (0, 1]", kv_ram_fraction));
  }
  if (batch_tokens < 1 || batch_tokens > (1 << 20)) {
    throw InvalidArgument(fmt::format("batch tokens {} must be in [1, {}]", batch_tokens, 1 << 20));
  }
}

// ---- Opening ---------------------------------------------------------------------

std::unique_ptr<Engine> Engine::open(const EngineOptions& options) {
  options.validate();
  auto file = std::make_shared<const gguf::File>(gguf::File::open(
      options.model_path, options.mmap ? gguf::LoadMode::Mmap : gguf::LoadMode::Read));
  return open(std::move(file), options);
}

std::unique_ptr<Engine> Engine::open(std::shared_ptr<const gguf::File> file,
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
  bool fp_cached = false;
  const std::string model_fp =
      model_fingerprint_cached(*m.file, *m.threads, &fp_cached, options.fingerprint_cache_dir);
  const KvLayout layout = kv_layout_for(hp, options.kv_type);
  uint64_t kv_bytes = options.kv_bytes;
  if (kv_bytes == 0) {
    // Only address space until blocks are written; the cap leaves the rest
    // of the machine usable.
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
  m.chat_template_text = m.file->opt_string("tokenizer.chat_template");

  EngineInfo& info = m.info;
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
  info.load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  m.scheduler =
      std::make_unique<Scheduler>(*m.ctx, *m.tokenizer, options.batch_tokens, options.prefix_cache);
  m.publish_stats();
  m.thread = std::thread([&m] { m.loop(); });
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
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
    std::deque<std::function<void()>> todo;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      wake.wait(lock,
                [&] { return stop || !incoming.empty() || !tasks.empty() || !scheduler->idle(); });
      stopping = stop;
      jobs.swap(incoming);
      todo.swap(tasks);
    }
    for (auto& job : jobs) scheduler->add(std::move(job));
    if (stopping) {
      scheduler->cancel_all();
      for (auto& task : todo) task();  // each reports "engine stopped" itself
      publish_stats();
      idle_cv.notify_all();
      return;
    }
    for (auto& task : todo) task();
    scheduler->iterate();
    publish_stats();
    {
      std::lock_guard<std::mutex> lock(mu);
      idle = scheduler->idle();
    }
    idle_cv.notify_all();
  }
}

void Engine::Impl::publish_stats() {
  EngineStats s = scheduler->counters();
  s.requests_submitted = submitted.load();
  s.seeds_drawn = seeds_drawn.load();
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
    tasks.push_back([fn, done, this] {
      if (stop) {
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
    impl_->incoming.push_back(std::move(job));
    impl_->idle = false;
  }
  ++impl_->submitted;
  impl_->wake.notify_all();
  return RequestHandle(std::move(shared));
}

Response Engine::run(Request request) {
  RequestHandle h = submit(std::move(request));
  return h.wait();
}

void Engine::drain() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->idle_cv.wait(lock,
                      [&] { return impl_->stop || (impl_->idle && impl_->incoming.empty()); });
}

const EngineInfo& Engine::info() const { return impl_->info; }

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->stats_mu);
  return impl_->stats;
}

std::string Engine::token_text(TokenId id) const {
  if (id < 0 || id >= impl_->tokenizer->n_vocab()) return {};
  return impl_->tokenizer->token_to_piece(id, true);
}

std::vector<TokenId> Engine::tokenize(std::string_view text) const {
  return impl_->tokenizer->encode(text, Tokenizer::EncodeOptions{});
}

// ---- Handles --------------------------------------------------------------------------------

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

const Response& RequestHandle::wait() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait(lock, [&] { return shared_->done; });
  return shared_->response;
}

std::optional<Event> RequestHandle::next() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait(lock, [&] { return !shared_->events.empty() || shared_->done; });
  if (shared_->events.empty()) return std::nullopt;
  Event e = std::move(shared_->events.front());
  shared_->events.pop_front();
  return e;
}

std::optional<Event> RequestHandle::next_for(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(shared_->mu);
  shared_->cv.wait_for(lock, timeout, [&] { return !shared_->events.empty() || shared_->done; });
  if (shared_->events.empty()) return std::nullopt;
  Event e = std::move(shared_->events.front());
  shared_->events.pop_front();
  return e;
}

void RequestHandle::cancel() {
  if (shared_) shared_->cancel = true;
}

bool RequestHandle::done() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->done;
}

}  // namespace encore
