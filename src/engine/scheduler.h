// Iteration-level continuous batching over ForwardContext::step.
//
// Each iterate() plans one forward step and runs it:
//   1. requests whose caller cancelled are dropped (their KV freed);
//   2. running requests add their pending tokens until the step's token
//      budget is spent: first the decoding ones (one token per sample; more
//      after a preemption or a resume: the ids not evaluated yet), then
//      those still in their prompt (a prefill chunk), each group highest
//      priority and oldest first;
//   3. if nothing was preempted, waiting requests are admitted in the same
//      order while KV blocks last (keeping a 1 % watermark for the running
//      ones), each starting with the longest prefix the cache has;
//   4. the step runs; new full blocks are published in the prefix cache;
//      every sequence whose last pending token was evaluated samples its
//      next token.
// When a running request needs a block and none is left, the newest running
// request (lowest priority, latest arrival) is preempted: its KV is freed and
// it goes back to the waiting queue with its samplers and ids, to be
// recomputed when it is admitted again. The first request in scheduling
// order can always proceed, since every request fits the pool on its own
// (checked at submission). Priority orders admission and the choice of
// victims; a waiting request never preempts a running one.
//
// Ownership: owns its Jobs; borrows the ForwardContext (model, pool, threads)
// and the tokenizer. Thread-safety: none; one thread (the engine's scheduler
// thread) drives it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "encore/engine.h"
#include "encore/model.h"
#include "engine/job.h"
#include "engine/persist.h"

namespace encore {

class Scheduler {
 public:
  // persist: the state tiers (null: none); blocks missing from the prefix
  // cache are looked up there before they are recomputed.
  Scheduler(ForwardContext& ctx, const Tokenizer& tokenizer, int32_t batch_tokens,
            bool prefix_cache, Persistence* persist);
  ~Scheduler();

  // Queues a validated job (submit.cpp: make_job). A job with nothing to do
  // (max_tokens 0, or every sample already finished) completes at once.
  void add(std::unique_ptr<Job> job);
  bool idle() const { return jobs_.empty(); }
  // One forward step (see the file comment). Does nothing when idle.
  void iterate();
  // Ends every job with Status::Cancelled and frees its KV (shutdown).
  void cancel_all();
  // Ends every job with `status` and `error` (the scheduler thread caught
  // an exception it cannot pin on one job).
  void end_all(Response::Status status, const std::string& error);

  // Counters of EngineStats that the scheduler keeps (the rest is the pool's).
  const EngineStats& counters() const { return counters_; }

 private:
  struct Planned {
    Job* job;
    int sample;  // -1: the job's prompt (base)
    int32_t count;
    bool logits;
  };

  void drop_cancelled();
  void plan();
  bool plan_job(Job& job);
  void admit();
  bool reserve(Job& job, KvSequence& seq, int64_t total);
  bool make_room(Job& job);
  bool fork(Job& job);
  void preempt(Job& job);
  void run_step();
  void after_step();
  void publish(Job& job, int sample);
  int32_t find_block(Job& job, const BlockKey& key, std::span<const TokenId> tokens, bool try_store,
                     bool* restored);
  void extend_sample(Job& job, int i);
  void advance(Job& job, int i);
  void finish_sample(Job& job, int i, FinishReason why);
  void release_kv(Job& job);
  void complete(Job& job, Response::Status status, std::string error = {});
  void remove(Job& job);

  ForwardContext& ctx_;
  KvBlockPool& pool_;
  const Tokenizer& tok_;
  const int32_t batch_tokens_;
  const bool prefix_cache_;
  Persistence* const persist_;
  const int n_vocab_;

  std::vector<std::unique_ptr<Job>> jobs_;
  std::vector<Job*> running_;  // hold KV; highest priority, then oldest, first
  std::vector<Job*> waiting_;  // the same order

  // The step being planned.
  int32_t budget_ = 0;
  std::vector<SeqTokens> entries_;
  std::vector<Planned> planned_;
  std::vector<Job*> done_;  // completed during this iteration; removed at its end

  EngineStats counters_;
};

}  // namespace encore
