// Stage 2 of a step (step_plan.h): runs the scheduler's plan through the
// model. Every planned sequence evaluates its tokens into its KV blocks
// (reserved by the scheduler); those whose last pending token is evaluated
// get their logits. Nothing here decides or samples.
//
// Ownership: borrows the forward context (model, KV pool, threads).
// Thread-safety: none; the engine's scheduler thread. Cost: one forward
// step of ForwardContext::step over every planned token.
#pragma once

#include "encore/model.h"
#include "engine/schedule/step_plan.h"

namespace encore {

class Runner {
 public:
  explicit Runner(ForwardContext& ctx) : ctx_(ctx) {}
  // Throws what the forward pass throws (nothing should: requests were
  // validated and blocks reserved); the caller fails the step's requests.
  void execute(const StepPlan& plan) { ctx_.step(plan.seqs); }

 private:
  ForwardContext& ctx_;
};

}  // namespace encore
