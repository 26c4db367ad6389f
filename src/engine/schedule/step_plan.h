// What passes between the three stages of one engine step:
//
//   Scheduler::schedule()  ->  StepPlan     which sequences evaluate which
//                                           tokens (KV reserved, nothing run)
//   Runner::execute(plan)                   the forward pass writes the KV and
//                                           the logits the plan asked for
//   OutputProcessor::process(plan)          samples, stop strings, events,
//                                           finish reasons, Responses
//     -> KvReleases                         the KV the finished samples and
//                                           requests give back
//   Scheduler::update(releases)             frees it, drops ended requests
//
// Ownership: the scheduler owns the plan and the Jobs it points at; a plan
// is valid until Scheduler::update(), which drops the jobs that ended.
// Plain data, no behaviour.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "encore/model.h"
#include "encore/request.h"

namespace encore {

struct Job;

struct StepPlan {
  // One planned sequence: what the runner evaluates for it.
  struct Entry {
    Job* job;
    int sample;     // -1: the job's prompt (its shared base sequence)
    int32_t count;  // tokens evaluated
    bool logits;    // the last pending token is evaluated: logits follow
  };
  // A request the scheduler ended before the step (its KV is freed already):
  // the output stage answers it.
  struct Ended {
    Job* job;
    Response::Status status;
    std::string error;
  };

  std::vector<SeqTokens> seqs;  // [entries] for ForwardContext::step, in step order
  std::vector<Entry> entries;   // [entries] who each seqs[k] belongs to
  std::vector<Ended> ended;     // cancelled, or failed at admission
  int32_t budget_left = 0;      // tokens of the step's budget not planned

  bool empty() const { return seqs.empty(); }
  void clear() {
    seqs.clear();
    entries.clear();
    ended.clear();
    budget_left = 0;
  }
};

// KV the output stage is done with, in the order it was done with it: the
// prefix cache evicts the least recently released block first, so the order
// is kept.
struct KvRelease {
  Job* job;
  int sample;  // -1: every sequence of the job (it ended)
};
using KvReleases = std::vector<KvRelease>;

}  // namespace encore
