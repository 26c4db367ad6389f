// Stage 3 of a step (step_plan.h): turns the logits the runner wrote into
// answers. For every planned sequence that has logits it draws the next token
// with the sample's sampler, as a sequential generation loop would (the
// reproducibility contract), and then does what follows a token: logprobs,
// text (decoder and stop strings), events for streams, finish reasons; when a
// request is over it builds its Response, saves its session and wakes the
// caller. Finished samples' KV blocks are queued for the state tiers here
// (before the KV goes); the KV itself is the scheduler's to free: the output
// stage only says what it is done with (KvReleases).
//
// Ownership: borrows the tokenizer and the state tiers; never touches the KV
// pool or the model. Thread-safety: none; the engine's scheduler thread.
#pragma once

#include <cstdint>
#include <string>

#include "encore/engine.h"
#include "encore/isa.h"
#include "encore/tokenizer.h"
#include "engine/job.h"
#include "engine/schedule/step_plan.h"
#include "engine/session/persist.h"

namespace encore {

class OutputProcessor {
 public:
  // n_ctx: a sample whose tokens fill it ends (FinishReason::Context).
  // isa: the kernels logprobs are computed with. persist: null without tiers.
  // sync_sessions: a session's answer ends once its record is written
  // (EngineOptions::async_session_writes false).
  OutputProcessor(const Tokenizer& tokenizer, int32_t n_ctx, Isa isa, Persistence* persist,
                  bool sync_sessions);

  // After a step: every entry with logits samples; a job's prompt that was
  // evaluated gives each new sample its first token. Appends what is done
  // with its KV to `out`.
  void process(const StepPlan& plan, KvReleases& out);
  // Answers the jobs the scheduler ended before the step.
  void end(const StepPlan& plan, KvReleases& out);
  // The step failed: every job in it ends with `error`.
  void fail(const StepPlan& plan, const std::string& error, KvReleases& out);
  // A job with nothing to generate (max_tokens 0, or every sample finished):
  // answered at once, without the scheduler.
  void finish_at_once(Job& job);
  // Ends a job: its Response out (and its session saved when Ok). Does
  // nothing for a job already answered.
  void complete(Job& job, Response::Status status, std::string error, KvReleases& out);

  // Counters of EngineStats the output stage keeps: tokens_generated and
  // requests_finished / _cancelled / _failed.
  const EngineStats& counters() const { return counters_; }

 private:
  void first_tokens(Job& job, KvReleases& out);
  void advance(Job& job, int i, KvReleases& out);
  void finish_sample(Job& job, int i, FinishReason why, KvReleases& out);

  const Tokenizer& tok_;
  const int32_t n_ctx_;
  const Isa isa_;
  Persistence* const persist_;
  const bool sync_sessions_;
  EngineStats counters_;
};

}  // namespace encore
