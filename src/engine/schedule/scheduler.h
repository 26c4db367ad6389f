// Stage 1 of a step (step_plan.h): iteration-level continuous batching.
// The scheduler decides who runs and holds the KV; it never runs the model
// and never samples.
//
// Each schedule() plans one forward step:
//   1. requests whose caller cancelled end (their KV freed);
//   2. running requests add their pending tokens until the step's token
//      budget is spent: first the decoding ones (one token per sample; more
//      after a preemption or a resume: the ids not evaluated yet), then
//      those still in their prompt (a prefill chunk), each group highest
//      priority and oldest first; a request whose prompt is evaluated first
//      forks it into one KV sequence per sample;
//   3. if nothing was preempted, waiting requests are admitted in the same
//      order while KV blocks last (keeping a 1 % watermark for the running
//      ones), each starting with the longest prefix the cache (or the state
//      tiers) has.
// After the runner evaluated the plan, after_step() publishes the new full
// blocks in the prefix cache; after the output stage sampled, update() frees
// the KV of what finished and drops the requests that ended.
//
// When a running request needs a block and none is left, the newest running
// request (lowest priority, latest arrival) is preempted: its KV is freed and
// it goes back to the waiting queue with its samplers and ids, to be
// recomputed when it is admitted again. The first request in scheduling
// order can always proceed, since every request fits the pool on its own
// (checked at submission). Priority orders admission and the choice of
// victims; a waiting request never preempts a running one.
//
// Ownership: owns its Jobs; borrows the KV pool and the state tiers.
// Thread-safety: none; one thread (the engine's scheduler thread) drives it.
// Needs no model: a unit test can drive it with a pool and Jobs alone.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "encore/engine.h"
#include "encore/kv_cache.h"
#include "engine/job.h"
#include "engine/schedule/step_plan.h"
#include "engine/session/persist.h"

namespace encore {

class Scheduler {
 public:
  // batch_tokens: the step's token budget. persist: the state tiers (null:
  // none); blocks missing from the prefix cache are looked up there before
  // they are recomputed.
  Scheduler(KvBlockPool& pool, int n_vocab, int32_t batch_tokens, bool prefix_cache,
            Persistence* persist);
  ~Scheduler();

  // Queues a validated job (submit.cpp: make_job) that has something to
  // generate.
  void add(std::unique_ptr<Job> job);
  bool idle() const { return jobs_.empty(); }
  // Plans the next step (see the file comment). The plan is empty when
  // there is nothing to run; plan.ended lists the requests that ended.
  const StepPlan& schedule();
  // The runner evaluated the plan: counts it and publishes the full blocks
  // it completed.
  void after_step(const StepPlan& plan);
  // Frees what the output stage released and drops the requests whose
  // Response is out (Job::completed).
  void update(const KvReleases& releases);
  // Frees every job's KV and hands the jobs over, newest first (shutdown, or
  // a failure no one request can be blamed for); the caller answers them.
  std::vector<std::unique_ptr<Job>> take_all();

  // Counters of EngineStats that the scheduler keeps.
  const EngineStats& counters() const { return counters_; }

 private:
  void drop_cancelled();
  void plan_step();
  bool plan_job(Job& job);
  void admit();
  void end(Job& job, Response::Status status, std::string error = {});
  bool reserve(Job& job, KvSequence& seq, int64_t total);
  bool make_room(Job& job);
  bool fork(Job& job);
  void preempt(Job& job);
  void publish(Job& job, int sample);
  int32_t find_block(Job& job, const BlockKey& key, std::span<const TokenId> tokens, bool try_store,
                     bool* restored);
  void extend_sample(Job& job, int i);
  void release_kv(Job& job);

  KvBlockPool& pool_;
  const int n_vocab_;
  const int32_t batch_tokens_;
  const bool prefix_cache_;
  Persistence* const persist_;

  std::vector<std::unique_ptr<Job>> jobs_;
  std::vector<Job*> running_;  // hold KV; highest priority, then oldest, first
  std::vector<Job*> waiting_;  // the same order

  StepPlan plan_;  // the step being planned, then run
  EngineStats counters_;
};

}  // namespace encore
