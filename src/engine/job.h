// One request inside the engine: what the caller's handle shares with the
// engine (RequestShared), and the request's runtime state (Job): its
// samples with their samplers, text state and KV sequences. The three stages
// of a step (step_plan.h) work on Jobs: the scheduler on their KV and phase,
// the output stage on their samplers, text and Response.
//
// A sample's tokens are the prompt ids followed by its generated ids; its KV
// sequence has evaluated the first seq.n_tokens of them. Whatever happened
// before (a fresh start, a fork of the prompt, a preemption that freed the
// KV, a resume from a saved state), the scheduler only ever evaluates the
// tokens that are not evaluated yet, and samples the next token from the
// logits of the last one. Chunk invariance (docs/invariance.md) makes every
// such path give the same bits.
//
// Ownership: a Job belongs to the scheduler thread; RequestShared is shared
// with the RequestHandle and guarded by its mutex.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "encore/kv_cache.h"
#include "encore/request.h"
#include "encore/sampler.h"
#include "encore/tokenizer.h"
#include "engine/output/stop_text.h"

namespace encore {

using Clock = std::chrono::steady_clock;

// The caller's view of a request: events (when streaming) and the Response.
struct RequestShared {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> events;  // not yet taken by next()
  bool done = false;         // `response` is final and Done was queued
  Response response;
  bool stream = false;
  uint64_t seed = 0;           // fixed at submission
  bool session_found = false;  // fixed at submission (Response::session_found)
  std::atomic<bool> cancel{false};

  // Scheduler side: queue an event (when streaming), or finish.
  void push(Event e);
  void finish(Response r);
};

struct SampleRun {
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> decoder;
  StopText stop;
  SampleState state;              // every id generated so far (all calls)
  SampleResult result;            // what this call generated
  KvSequence seq;                 // empty while the job holds no KV
  std::vector<BlockHash> hashes;  // [full blocks of seq] hash chain (publishing)
  std::vector<float> logits;      // [n_vocab] after the last evaluated token
  bool active = true;             // not finished
};

struct Job {
  enum class Phase {
    Waiting,  // no KV (never admitted, or preempted)
    Prompt,   // the prompt is being evaluated into `base`
    Decode,   // samples evaluate their own tokens and sample
  };

  uint64_t order = 0;  // arrival number: first come, first served
  int32_t priority = 0;
  std::shared_ptr<RequestShared> shared;

  // The validated request (submit.cpp: make_job).
  std::vector<TokenId> prompt;
  int32_t max_tokens = -1;
  int32_t logprobs = -1;
  bool ignore_eos = false;
  std::string tenant;
  std::string session;        // save the session at the end ("": none)
  bool persist = false;       // write the samples' blocks to the state tiers at the end
  Request saved;              // what a session record keeps of the request (no prompt text)
  uint64_t session_seed = 0;  // the session's counts after this call (RunState)
  int64_t session_turns = 0;
  uint64_t session_generation = 0;
  bool continues_answer = false;         // saved.messages ends with the answer this call extends
  BlockHash root;                        // prefix_root(system fingerprint, tenant)
  std::vector<BlockHash> prompt_hashes;  // [prompt.size() / block_tokens] hash chain

  Phase phase = Phase::Waiting;
  bool completed = false;          // the Response is out; the job leaves after this step
  KvSequence base;                 // the prompt's KV until it is forked into the samples
  size_t base_published = 0;       // full blocks of `base` already in the prefix cache
  std::vector<float> base_logits;  // [n_vocab] after the prompt
  std::vector<SampleRun> samples;  // [n]
  bool admitted_once = false;
  bool restored_once = false;  // some KV came from the state tiers (counted once)
  // The state tiers had no block for prompt block index >= this: a job that
  // waits for room does not ask them again at every step.
  size_t store_miss_at = SIZE_MAX;

  Response response;  // seed, prompt ids, usage, timings; samples/states at the end
  Clock::time_point submitted;
  Clock::time_point first_step;
  Clock::time_point prompt_done;
  bool any_token = false;

  size_t n_active() const;
  // Nothing to generate (max_tokens 0, or every sample already finished):
  // answered at once, never scheduled.
  bool nothing_to_generate() const { return max_tokens == 0 || n_active() == 0; }
  // Token at position `pos` of sample s: prompt ids, then its generated ids.
  TokenId token_at(const SampleRun& s, int64_t pos) const;
  int64_t total_tokens(const SampleRun& s) const {
    return static_cast<int64_t>(prompt.size() + s.state.ids.size());
  }
};

// Checks a saved SampleState against the prompt and sets sample `s` up from
// it: the RNG counter, penalty window, decoder bytes and held stop text are
// recomputed from the ids and must equal the saved ones (an edited file or
// another request's state is an InvalidArgument naming sample i).
void restore_sample(SampleRun& s, const SampleState& st, int i, const std::vector<TokenId>& prompt,
                    int n_vocab);

}  // namespace encore
