// The scheduler's plan alone (engine/schedule/): no model, no sampler, no
// tokenizer. A KV pool and hand-made Jobs go in; the test plays the runner
// (it advances each planned sequence by its tokens) and the output stage (it
// appends a token id where the plan asked for logits), and checks that each
// plan is what the policy in scheduler.h says.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "engine/job.h"
#include "engine/schedule/scheduler.h"

namespace encore {
namespace {

constexpr int kBlockTokens = 4;
constexpr int kVocab = 16;

class SchedulerPlan : public ::testing::Test {
 protected:
  void make(int32_t n_blocks, int32_t batch_tokens, bool prefix_cache = false) {
    layout_.n_layer = 1;
    layout_.n_kv_heads = 1;
    layout_.head_dim = 4;
    layout_.block_tokens = kBlockTokens;
    layout_.elem_type = DType::F32;
    pool_ = std::make_unique<KvBlockPool>(layout_, n_blocks * layout_.block_bytes());
    sched_ = std::make_unique<Scheduler>(*pool_, kVocab, batch_tokens, prefix_cache, nullptr);
  }
  void TearDown() override {
    if (sched_) sched_->take_all();  // frees the jobs' KV before the pool goes
    sched_.reset();
  }

  // A job of `n_prompt` tokens (starting at `first`) and `n` samples; the
  // scheduler owns it, the test keeps a pointer.
  Job* add(int32_t n_prompt, int priority = 0, int n = 1, int32_t first = 0) {
    auto job = std::make_unique<Job>();
    job->order = next_order_++;
    job->priority = priority;
    job->shared = std::make_shared<RequestShared>();
    for (int32_t t = 0; t < n_prompt; ++t) job->prompt.push_back(first + t);
    job->max_tokens = 100;
    job->samples.resize(static_cast<size_t>(n));
    job->root = prefix_root("scheduler test", "");
    for (size_t b = 0; b + kBlockTokens <= job->prompt.size(); b += kBlockTokens) {
      job->prompt_hashes.push_back(
          block_hash(job->prompt_hashes.empty() ? job->root : job->prompt_hashes.back(),
                     std::span<const int32_t>(job->prompt).subspan(b, kBlockTokens)));
    }
    Job* j = job.get();
    sched_->add(std::move(job));
    return j;
  }

  // One step with a pretend runner and output stage; the plan it ran.
  struct Planned {
    Job* job;
    int sample;
    int32_t count;
    bool logits;
    bool operator==(const Planned&) const = default;
  };
  std::vector<Planned> step() {
    const StepPlan& plan = sched_->schedule();
    std::vector<Planned> out;
    for (size_t k = 0; k < plan.seqs.size(); ++k) {
      const StepPlan::Entry& e = plan.entries[k];
      EXPECT_EQ(plan.seqs[k].tokens.size(), static_cast<size_t>(e.count));
      EXPECT_EQ(plan.seqs[k].logits.empty(), !e.logits);
      out.push_back({e.job, e.sample, e.count, e.logits});
      plan.seqs[k].seq->n_tokens += e.count;  // the runner
    }
    sched_->after_step(plan);
    KvReleases releases;
    for (const StepPlan::Ended& e : plan.ended) {
      e.job->completed = true;
      releases.push_back({e.job, -1});
    }
    for (const StepPlan::Entry& e : plan.entries) {  // the output stage: one token
      if (!e.logits) continue;
      for (size_t i = 0; i < e.job->samples.size(); ++i) {
        SampleRun& s = e.job->samples[i];
        if (e.sample >= 0 ? static_cast<int>(i) == e.sample : s.state.ids.empty()) {
          s.state.ids.push_back(static_cast<TokenId>(i + 1));
        }
      }
    }
    sched_->update(releases);
    return out;
  }

  KvLayout layout_;
  std::unique_ptr<KvBlockPool> pool_;
  std::unique_ptr<Scheduler> sched_;
  uint64_t next_order_ = 0;
};

// Decoding samples get their token before any prompt chunk, whatever the
// priorities: a long prompt never stalls the streams already generating.
TEST_F(SchedulerPlan, DecodesComeBeforePromptChunks) {
  make(64, 8);
  Job* a = add(4);
  EXPECT_EQ(step(), (std::vector<Planned>{{a, -1, 4, true}}));
  Job* b = add(20, /*priority=*/1, 1, 100);
  EXPECT_EQ(step(), (std::vector<Planned>{{a, 0, 1, true}, {b, -1, 7, false}}));
  // b runs first by priority now, yet a's decode still comes first.
  EXPECT_EQ(step(), (std::vector<Planned>{{a, 0, 1, true}, {b, -1, 7, false}}));
  EXPECT_EQ(step(), (std::vector<Planned>{{a, 0, 1, true}, {b, -1, 6, true}}));
  // b's prompt is done: it forks and decodes too (after a, in the prompt pass).
  EXPECT_EQ(step(), (std::vector<Planned>{{a, 0, 1, true}, {b, 0, 1, true}}));
}

// Admission: highest priority first, then first come, first served, while
// the budget lasts.
TEST_F(SchedulerPlan, WaitingRequestsAreAdmittedByPriorityThenArrival) {
  make(64, 4);
  Job* c = add(2, 0);
  Job* d = add(2, 2, 1, 10);
  Job* e = add(2, 2, 1, 20);
  EXPECT_EQ(step(), (std::vector<Planned>{{d, -1, 2, true}, {e, -1, 2, true}}));
  EXPECT_EQ(step(), (std::vector<Planned>{{d, 0, 1, true}, {e, 0, 1, true}, {c, -1, 2, true}}));
}

// A request whose blocks do not fit waits, and nobody behind it skips ahead
// (a 1 % watermark, at least one block, stays free for the running ones).
TEST_F(SchedulerPlan, AdmissionWaitsForBlocksAndNobodySkipsAhead) {
  make(6, 64);
  Job* r = add(8);              // 2 blocks
  Job* x = add(16, 0, 1, 100);  // 4 blocks: 4 + 1 > 4 free
  Job* y = add(2, 0, 1, 200);   // 1 block would fit, but x is first
  EXPECT_EQ(step(), (std::vector<Planned>{{r, -1, 8, true}}));
  EXPECT_EQ(x->phase, Job::Phase::Waiting);
  EXPECT_EQ(y->phase, Job::Phase::Waiting);
  EXPECT_EQ(pool_->n_free(), 4);
}

// When a running request needs a block and none is left, the newest running
// request is preempted (its blocks freed, back to waiting) and the step
// admits no one.
TEST_F(SchedulerPlan, TheNewestRunningRequestIsPreemptedWhenThePoolIsFull) {
  make(7, 32);
  Job* a = add(8);
  Job* b = add(8, 0, 1, 100);
  Job* c = add(8, 0, 1, 200);
  Job* late = add(1, 0, 1, 300);
  EXPECT_EQ(step(), (std::vector<Planned>{{a, -1, 8, true}, {b, -1, 8, true}, {c, -1, 8, true}}));
  EXPECT_EQ(pool_->n_free(), 1);
  // a takes the last free block for its 9th token; b needs one: c goes.
  EXPECT_EQ(step(), (std::vector<Planned>{{a, 0, 1, true}, {b, 0, 1, true}}));
  EXPECT_EQ(c->phase, Job::Phase::Waiting);
  EXPECT_EQ(c->response.preemptions, 1);
  EXPECT_EQ(sched_->counters().preemptions, 1);
  EXPECT_EQ(late->phase, Job::Phase::Waiting);    // a preempting step admits no one
  EXPECT_EQ(c->samples[0].state.ids.size(), 1u);  // its token is kept, to be recomputed
}

// A cancelled request ends before the plan, and its blocks serve this step.
TEST_F(SchedulerPlan, ACancelledRequestEndsAndGivesItsBlocksBack) {
  make(8, 64);
  Job* a = add(16);             // 4 blocks
  Job* b = add(13, 0, 1, 100);  // 4 + 1 > 4 free: waits
  step();
  EXPECT_EQ(b->phase, Job::Phase::Waiting);
  a->shared->cancel = true;
  const StepPlan& plan = sched_->schedule();
  ASSERT_EQ(plan.ended.size(), 1u);
  EXPECT_EQ(plan.ended[0].job, a);
  EXPECT_EQ(plan.ended[0].status, Response::Status::Cancelled);
  ASSERT_EQ(plan.entries.size(), 1u);
  EXPECT_EQ(plan.entries[0].job, b);
  EXPECT_EQ(plan.entries[0].count, 13);
}

// After its prompt, a request of n samples forks: one sequence per sample,
// full blocks shared, the partial last block copied.
TEST_F(SchedulerPlan, APromptForksIntoOneSequencePerSample) {
  make(16, 64);
  Job* j = add(6, 0, 3);
  EXPECT_EQ(step(), (std::vector<Planned>{{j, -1, 6, true}}));
  EXPECT_EQ(step(), (std::vector<Planned>{{j, 0, 1, true}, {j, 1, 1, true}, {j, 2, 1, true}}));
  const int32_t shared = j->samples[0].seq.blocks[0];
  for (const SampleRun& s : j->samples) {
    ASSERT_EQ(s.seq.blocks.size(), 2u);
    EXPECT_EQ(s.seq.blocks[0], shared);
  }
  EXPECT_EQ(pool_->refcount(shared), 3);
  EXPECT_NE(j->samples[0].seq.blocks[1], j->samples[1].seq.blocks[1]);
  EXPECT_EQ(j->base.blocks.size(), 0u);
}

// With the prefix cache, a second request with the same prompt starts after
// the cached full blocks (one token at least is evaluated for its logits).
TEST_F(SchedulerPlan, ACachedPrefixIsNotRecomputed) {
  make(32, 64, /*prefix_cache=*/true);
  Job* a = add(10);
  EXPECT_EQ(step(), (std::vector<Planned>{{a, -1, 10, true}}));
  Job* b = add(10);
  Job* c = add(8);  // all full: the last block is evaluated again for the logits
  EXPECT_EQ(step(), (std::vector<Planned>{{a, 0, 1, true}, {b, -1, 2, true}, {c, -1, 4, true}}));
  EXPECT_EQ(b->response.usage.cached_tokens, 8);
  EXPECT_EQ(c->response.usage.cached_tokens, 4);
  EXPECT_EQ(sched_->counters().prefix_hit_tokens, 12);
}

// Without it, every prompt is evaluated whole.
TEST_F(SchedulerPlan, WithoutThePrefixCacheEveryPromptIsEvaluated) {
  make(32, 64, /*prefix_cache=*/false);
  Job* a = add(10);
  step();
  Job* b = add(10);
  EXPECT_EQ(step(), (std::vector<Planned>{{a, 0, 1, true}, {b, -1, 10, true}}));
  EXPECT_EQ(b->response.usage.cached_tokens, 0);
}

// A request preempted after its first token was drawn (before the fork) is
// admitted again when blocks come back: its prompt is evaluated again (the
// output stage draws nothing, the sample has its id), then the kept token.
TEST_F(SchedulerPlan, ARequestPreemptedBeforeItsForkKeepsItsFirstToken) {
  make(7, 32);
  Job* a = add(8);
  Job* b = add(8, 0, 1, 100);
  Job* c = add(8, 0, 1, 200);
  step();
  step();  // c preempted with one id
  ASSERT_EQ(c->phase, Job::Phase::Waiting);
  ASSERT_EQ(c->samples[0].state.ids.size(), 1u);
  // a and b end: the output stage releases what they hold.
  a->completed = true;
  b->completed = true;
  sched_->update({{a, -1}, {b, -1}});
  EXPECT_EQ(pool_->n_free(), 7);
  EXPECT_EQ(step(), (std::vector<Planned>{{c, -1, 8, true}}));
  EXPECT_EQ(c->samples[0].state.ids.size(), 1u);  // not drawn again
  EXPECT_EQ(step(), (std::vector<Planned>{{c, 0, 1, true}}));
  EXPECT_EQ(c->samples[0].state.ids.size(), 2u);
  c->completed = true;
  sched_->update({{c, 0}, {c, -1}});
  EXPECT_TRUE(sched_->idle());
  EXPECT_EQ(pool_->n_free(), 7);
}

// What the output stage releases (a finished sample, then its ended job) and
// what take_all takes (the rest, at shutdown) give every block back.
TEST_F(SchedulerPlan, ReleasesAndTakeAllGiveEveryBlockBack) {
  make(16, 64, true);
  Job* j = add(6, 0, 3);
  Job* k = add(5, 0, 2, 50);
  step();
  step();
  step();
  j->samples[1].active = false;
  sched_->update({{j, 1}});
  j->completed = true;
  sched_->update({{j, 0}, {j, -1}});
  auto all = sched_->take_all();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].get(), k);
  EXPECT_EQ(pool_->n_free(), 16);
}

}  // namespace
}  // namespace encore
