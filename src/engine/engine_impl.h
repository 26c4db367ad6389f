// What an Engine holds (engine.h), for the files of src/engine that need
// more than the public interface (the benchmark driver).
//
// Threads: the scheduler thread owns `scheduler` and is the only one that
// touches the model, the KV pool, the forward context and the thread pool;
// other threads hand it jobs (`incoming`) and tasks under `mu`.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "encore/engine.h"
#include "encore/gguf.h"
#include "encore/jinja.h"
#include "encore/kv_cache.h"
#include "encore/model.h"
#include "encore/thread_pool.h"
#include "encore/tokenizer.h"
#include "engine/execute/runner.h"
#include "engine/output/output.h"
#include "engine/schedule/scheduler.h"
#include "engine/seed_reuse.h"
#include "engine/session/persist.h"

namespace encore {

struct Engine::Impl {
  EngineOptions options;
  std::shared_ptr<const gguf::File> file;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ThreadPool> threads;
  std::unique_ptr<KvBlockPool> pool;
  std::unique_ptr<ForwardContext> ctx;
  std::unique_ptr<Persistence> persist;  // state tiers; null without them
  // The step's three stages (step_plan.h).
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<Runner> runner;
  std::unique_ptr<OutputProcessor> output;
  EngineInfo info;
  // The Jinja chat template (EngineOptions::chat_template_text, else the
  // model's), parsed once: null when there is none or it did not parse
  // (chat_jinja_error says why).
  std::shared_ptr<const jinja::Template> chat_jinja;
  std::string chat_jinja_error;
  std::string chat_jinja_origin;  // "model" or "file"
  std::string chat_jinja_hash;    // SHA-256 (hex) of its source
  uint64_t max_token_bytes = 1;   // the longest token text (bounds prompts)

  std::mutex mu;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Job>> incoming;
  std::deque<std::function<void(bool stopping)>> tasks;
  bool stop = false;
  bool idle = true;  // the scheduler has no job (set after each iteration)
  std::condition_variable idle_cv;
  uint64_t next_order = 0;            // guarded by mu
  std::atomic<int64_t> submitted{0};  // counted before the job is queued
  std::atomic<int64_t> seeds_drawn{0};
  std::atomic<int64_t> seeds_session{0};
  std::atomic<int64_t> seeds_derived{0};
  std::atomic<int64_t> seeds_reused{0};
  SeedReuse seed_reuse;  // per tenant, bounded (seed_reuse.h)
  mutable std::mutex stats_mu;
  EngineStats stats;  // snapshot after each scheduler iteration
  std::thread thread;

  void loop();
  // One step: plan, execute, output, update (scheduler thread).
  void step();
  // Ends every job with `status` (shutdown, or a failure of the step itself).
  void end_all(Response::Status status, const std::string& error);
  void publish_stats();
  // Validates and tokenizes a request into a Job (caller's thread).
  std::unique_ptr<Job> make_job(Request r);
  // Its parts (submit.cpp): the prompt's ids; the samples.
  std::vector<TokenId> prompt_of(Request& r, Response* resp);
  void make_samples(Job& job, Request& r, const std::optional<uint64_t>& turn_seed);
  // What continuing a session found (see submit.cpp).
  struct SessionStart {
    bool found = false;
    bool continues_answer = false;  // no prompt: the last answer of a chat goes on
    // A new turn (a prompt) without a seed: the session's seed + the turn's
    // index, so a conversation replays by default (SeedSource::Session).
    std::optional<uint64_t> turn_seed;
    // The counts (RunState) of the record this call saves: the found
    // record's seed (none: this call's is the session's), turns after this
    // call, and the found record's generation.
    std::optional<uint64_t> session_seed;
    int64_t turns = 1;
    uint64_t generation = 0;
    std::vector<ChatMessage> history;
    std::string chat_template;
  };
  SessionStart continue_session(Request& r);
  // Runs fn on the scheduler thread between steps and waits for it
  // (exceptions are rethrown here). For work that drives the forward context
  // directly (benchmarks).
  void run_exclusive(const std::function<void()>& fn);
};

}  // namespace encore
