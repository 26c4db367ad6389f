// Continuous batching: stage 1 of a step (see scheduler.h).
#include "engine/schedule/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "encore/error.h"

namespace encore {
namespace {

// Scheduling order: higher priority first, then first come, first served.
bool runs_before(const Job* a, const Job* b) {
  return a->priority > b->priority || (a->priority == b->priority && a->order < b->order);
}

void insert_sorted(std::vector<Job*>& list, Job* job) {
  list.insert(std::upper_bound(list.begin(), list.end(), job, runs_before), job);
}

void erase_from(std::vector<Job*>& list, const Job* job) {
  const auto it = std::find(list.begin(), list.end(), job);
  if (it != list.end()) list.erase(it);
}

}  // namespace

Scheduler::Scheduler(KvBlockPool& pool, int n_vocab, int32_t batch_tokens, bool prefix_cache,
                     Persistence* persist)
    : pool_(pool),
      n_vocab_(n_vocab),
      batch_tokens_(batch_tokens),
      prefix_cache_(prefix_cache),
      persist_(prefix_cache ? persist : nullptr) {}

Scheduler::~Scheduler() {
  // The engine answers every job (take_all) before it stops: one left here
  // would leave its caller waiting.
  assert(jobs_.empty());
  for (const auto& job : jobs_) release_kv(*job);
}

void Scheduler::add(std::unique_ptr<Job> job) {
  assert(!job->nothing_to_generate());
  insert_sorted(waiting_, job.get());
  jobs_.push_back(std::move(job));
}

const StepPlan& Scheduler::schedule() {
  plan_.clear();
  drop_cancelled();
  plan_step();
  counters_.requests_running = static_cast<int64_t>(running_.size());
  counters_.requests_waiting = static_cast<int64_t>(waiting_.size());
  return plan_;
}

void Scheduler::update(const KvReleases& releases) {
  for (const KvRelease& r : releases) {
    if (r.sample < 0) {
      release_kv(*r.job);
    } else {
      r.job->samples[static_cast<size_t>(r.sample)].seq.release(pool_);
    }
  }
  std::erase_if(jobs_, [&](const std::unique_ptr<Job>& j) {
    if (!j->completed) return false;
    erase_from(running_, j.get());
    erase_from(waiting_, j.get());
    return true;
  });
  counters_.requests_running = static_cast<int64_t>(running_.size());
  counters_.requests_waiting = static_cast<int64_t>(waiting_.size());
}

std::vector<std::unique_ptr<Job>> Scheduler::take_all() {
  std::vector<std::unique_ptr<Job>> out;
  while (!jobs_.empty()) {  // newest first
    release_kv(*jobs_.back());
    out.push_back(std::move(jobs_.back()));
    jobs_.pop_back();
  }
  running_.clear();
  waiting_.clear();
  plan_.clear();
  return out;
}

// Ends a job before the step: its KV goes now (this step may use it), its
// Response comes from the output stage (StepPlan::ended).
void Scheduler::end(Job& job, Response::Status status, std::string error) {
  release_kv(job);
  erase_from(running_, &job);
  erase_from(waiting_, &job);
  plan_.ended.push_back({&job, status, std::move(error)});
}

void Scheduler::drop_cancelled() {
  for (const auto& job : jobs_) {
    if (job->shared->cancel.load(std::memory_order_relaxed)) end(*job, Response::Status::Cancelled);
  }
}

// ---- Planning ------------------------------------------------------------------

void Scheduler::plan_step() {
  plan_.budget_left = batch_tokens_;
  const int64_t preemptions_before = counters_.preemptions;
  // Decodes first, then prompt chunks, each pass in priority-then-age order:
  // a long prompt never stalls the streams that are already generating.
  // plan_job may preempt any later-ordered job (or the job itself), so the
  // passes walk a snapshot and skip jobs that left the running state.
  const std::vector<Job*> order = running_;
  for (const bool decode : {true, false}) {
    for (Job* job : order) {
      if (plan_.budget_left == 0) break;
      assert(!job->completed);  // update() dropped the jobs that ended
      if (job->phase == Job::Phase::Waiting) continue;
      if ((job->phase == Job::Phase::Decode) != decode) continue;
      plan_job(*job);
    }
  }
  // A step that had to preempt admits nothing new: the pool is short.
  if (counters_.preemptions == preemptions_before) admit();
}

// Adds the job's pending tokens to the step. False when the job had to be
// preempted itself (it was the newest and the pool had no block left).
bool Scheduler::plan_job(Job& job) {
  if (job.phase == Job::Phase::Prompt) {
    const int64_t n = job.base.n_tokens, p = static_cast<int64_t>(job.prompt.size());
    if (n == p) return fork(job) && plan_job(job);
    const auto count = static_cast<int32_t>(std::min<int64_t>(p - n, plan_.budget_left));
    if (count == 0) return true;
    if (!reserve(job, job.base, n + count)) return false;
    const bool last = n + count == p;
    plan_.seqs.push_back({&job.base, std::span<const TokenId>(job.prompt).subspan(n, count),
                          last ? std::span<float>(job.base_logits) : std::span<float>()});
    plan_.entries.push_back({&job, -1, count, last});
    plan_.budget_left -= count;
    return true;
  }
  assert(job.phase == Job::Phase::Decode);
  const auto p = static_cast<int64_t>(job.prompt.size());
  for (size_t i = 0; i < job.samples.size() && plan_.budget_left > 0; ++i) {
    SampleRun& s = job.samples[i];
    if (!s.active) continue;
    const int64_t n = s.seq.n_tokens, total = job.total_tokens(s);
    assert(total > n && n >= p);
    const auto count = static_cast<int32_t>(std::min<int64_t>(total - n, plan_.budget_left));
    if (!reserve(job, s.seq, n + count)) return false;
    const bool last = n + count == total;
    plan_.seqs.push_back({&s.seq, std::span<const TokenId>(s.state.ids).subspan(n - p, count),
                          last ? std::span<float>(s.logits) : std::span<float>()});
    plan_.entries.push_back({&job, static_cast<int>(i), count, last});
    plan_.budget_left -= count;
  }
  return true;
}

// Makes `seq` hold blocks for `total` tokens, preempting the newest running
// jobs while the pool is short. False when `job` itself had to go.
bool Scheduler::reserve(Job& job, KvSequence& seq, int64_t total) {
  for (;;) {
    try {
      seq.reserve(pool_, static_cast<int32_t>(total));
      return true;
    } catch (const ResourceExhausted&) {
      // Every block is referenced: free the newest running job's.
    }
    if (!make_room(job)) return false;
  }
}

// Preempts the newest running job. False when that was `job` itself.
bool Scheduler::make_room(Job& job) {
  assert(!running_.empty() && "no running job to preempt, yet the pool is full");
  if (running_.empty()) return false;
  Job* victim = running_.back();
  assert(!victim->completed);  // update() dropped the jobs that ended
  preempt(*victim);
  return victim != &job;
}

// The prompt is evaluated (and the output stage drew each new sample's
// first token from its logits): every active sample gets its own copy of
// the KV (full blocks shared, the partial last block copied; the last sample
// takes the prompt's sequence over). A sample with ids of its own (resumed,
// or preempted after its first token) then takes what the cache has of them.
bool Scheduler::fork(Job& job) {
  std::vector<int> active;
  for (size_t i = 0; i < job.samples.size(); ++i) {
    if (job.samples[i].active) active.push_back(static_cast<int>(i));
  }
  assert(!active.empty());
  const int bt = pool_.layout().block_tokens;
  const auto full = static_cast<size_t>(job.base.n_tokens / bt);
  for (size_t k = 0; k + 1 < active.size(); ++k) {
    SampleRun& s = job.samples[static_cast<size_t>(active[k])];
    for (;;) {
      try {
        s.seq = job.base.fork(pool_);
        break;
      } catch (const ResourceExhausted&) {
      }
      if (!make_room(job)) return false;
    }
  }
  std::swap(job.samples[static_cast<size_t>(active.back())].seq, job.base);
  const std::vector<BlockHash> hashes(job.prompt_hashes.begin(),
                                      job.prompt_hashes.begin() + static_cast<ptrdiff_t>(full));
  job.phase = Job::Phase::Decode;
  for (int i : active) {
    SampleRun& s = job.samples[static_cast<size_t>(i)];
    s.hashes = hashes;
    // Filled by the sample's last chunk (a sample that drew its first token
    // from the prompt's logits holds those; they are overwritten too).
    if (s.logits.size() != static_cast<size_t>(n_vocab_)) {
      s.logits.assign(static_cast<size_t>(n_vocab_), 0.0f);
    }
    extend_sample(job, i);
  }
  return true;
}

void Scheduler::preempt(Job& job) {
  // Entries of this step already planned for it go (their sequences are
  // about to be released).
  for (size_t e = plan_.entries.size(); e-- > 0;) {
    if (plan_.entries[e].job != &job) continue;
    plan_.budget_left += plan_.entries[e].count;
    plan_.entries.erase(plan_.entries.begin() + static_cast<ptrdiff_t>(e));
    plan_.seqs.erase(plan_.seqs.begin() + static_cast<ptrdiff_t>(e));
  }
  release_kv(job);
  job.phase = Job::Phase::Waiting;
  ++job.response.preemptions;
  ++counters_.preemptions;
  erase_from(running_, &job);
  insert_sorted(waiting_, &job);
}

void Scheduler::admit() {
  const int bt = pool_.layout().block_tokens;
  while (!waiting_.empty() && plan_.budget_left > 0) {
    Job& job = *waiting_.front();
    const auto p = static_cast<int64_t>(job.prompt.size());
    // The longest cached prefix, leaving at least one token to evaluate (its
    // logits start the generation).
    std::vector<int32_t> hits;
    int64_t restored = 0;  // of the hits, from the state tiers
    if (prefix_cache_) {
      const auto max_hits = static_cast<size_t>((p - 1) / bt);
      for (size_t b = 0; b < std::min(max_hits, job.prompt_hashes.size()); ++b) {
        const BlockKey key{job.prompt_hashes[b], b == 0 ? job.root : job.prompt_hashes[b - 1],
                           job.root};
        bool from_store = false;
        const int32_t block =
            find_block(job, key,
                       std::span<const TokenId>(job.prompt)
                           .subspan(b * static_cast<size_t>(bt), static_cast<size_t>(bt)),
                       b < job.store_miss_at, &from_store);
        if (block < 0) {
          job.store_miss_at = std::min(job.store_miss_at, b);
          break;
        }
        hits.push_back(block);
        restored += from_store ? 1 : 0;
      }
    }
    const int64_t n = static_cast<int64_t>(hits.size()) * bt;
    const int64_t count = std::min<int64_t>(p - n, plan_.budget_left);
    const int64_t need = kv_blocks_for_tokens(n + count, bt) - static_cast<int64_t>(hits.size());
    const int64_t watermark = running_.empty() ? 0 : std::max(1, pool_.n_blocks() / 100);
    if (need + watermark > pool_.n_free()) {
      for (auto b = hits.rbegin(); b != hits.rend(); ++b) pool_.release(*b);  // back to the cache
      if (running_.empty()) {
        // Nothing holds blocks that could come back: only blocks taken
        // outside the scheduler (a bug) could cause this. Fail the job
        // rather than wait for ever.
        end(job, Response::Status::Failed,
            fmt::format("the KV pool has {} free blocks; the prompt needs {}", pool_.n_free(),
                        need));
        continue;
      }
      break;  // first come, first served: nobody skips ahead
    }
    if (prefix_cache_) {
      ++counters_.prefix_lookups;
      counters_.prefix_hit_blocks += static_cast<int64_t>(hits.size()) - restored;
      counters_.prefix_hit_tokens += n - restored * bt;
    }
    job.base_logits.assign(static_cast<size_t>(n_vocab_), 0.0f);
    job.base_published = hits.size();
    job.base.blocks = std::move(hits);
    job.base.n_tokens = static_cast<int32_t>(n);
    if (!job.admitted_once) {
      job.admitted_once = true;
      job.response.usage.cached_tokens = n;
      job.response.usage.restored_tokens = restored * bt;
      job.first_step = Clock::now();
    }
    job.phase = Job::Phase::Prompt;
    waiting_.erase(waiting_.begin());
    insert_sorted(running_, &job);
    plan_job(job);  // cannot preempt: the blocks were counted above
  }
}

// A full block for `key` from the prefix cache, else from the state tiers
// (copied into the pool and published); -1 when neither has it.
int32_t Scheduler::find_block(Job& job, const BlockKey& key, std::span<const TokenId> tokens,
                              bool try_store, bool* restored) {
  *restored = false;
  int32_t block = pool_.lookup(key, tokens);
  if (block < 0 && persist_ && try_store) {
    block = persist_->restore(job.tenant, key, tokens);
    *restored = block >= 0;
    if (*restored && !job.restored_once) {  // EngineStats::requests_restored
      job.restored_once = true;
      ++counters_.requests_restored;
    }
  }
  return block;
}

// A sample that has ids to evaluate after the prompt (resumed, or preempted)
// takes the full blocks of its own tokens from the cache or the tiers
// instead of recomputing them, up to the block before its last token (whose
// logits it needs). The prompt's partial last block, copied by the fork, is
// replaced by the cached full block that continues it: its first positions
// hold the same bits.
void Scheduler::extend_sample(Job& job, int i) {
  if (!prefix_cache_) return;
  SampleRun& s = job.samples[static_cast<size_t>(i)];
  const int64_t bt = pool_.layout().block_tokens;
  const int64_t max_full = (job.total_tokens(s) - 1) / bt;
  std::vector<TokenId> tokens(static_cast<size_t>(bt));
  for (auto b = static_cast<int64_t>(s.hashes.size()); b < max_full; ++b) {
    for (int64_t k = 0; k < bt; ++k) tokens[static_cast<size_t>(k)] = job.token_at(s, b * bt + k);
    const BlockHash parent = b == 0 ? job.root : s.hashes.back();
    const BlockKey key{block_hash(parent, tokens), parent, job.root};
    bool restored = false;
    const int32_t block = find_block(job, key, tokens, /*try_store=*/true, &restored);
    if (block < 0) return;
    if (static_cast<size_t>(b) < s.seq.blocks.size()) {
      pool_.release(s.seq.blocks[static_cast<size_t>(b)]);
      s.seq.blocks[static_cast<size_t>(b)] = block;
    } else {
      s.seq.blocks.push_back(block);
    }
    s.hashes.push_back(key.hash);
    s.seq.n_tokens = static_cast<int32_t>((b + 1) * bt);
    ++counters_.prefix_hit_blocks;
    counters_.prefix_hit_tokens += bt;
  }
}

// ---- After the step ---------------------------------------------------------------

void Scheduler::after_step(const StepPlan& plan) {
  ++counters_.steps;
  for (const StepPlan::Entry& e : plan.entries) {
    counters_.tokens_evaluated += e.count;
    publish(*e.job, e.sample);
  }
}

// Publishes the full blocks of the job's base (sample -1) or sample that the
// step completed, continuing their hash chains.
void Scheduler::publish(Job& job, int sample) {
  if (!prefix_cache_) return;
  const int bt = pool_.layout().block_tokens;
  if (sample < 0) {  // the prompt's blocks: their hashes are known
    const auto full = static_cast<size_t>(job.base.n_tokens / bt);
    for (size_t& b = job.base_published; b < full; ++b) {
      const BlockKey key{job.prompt_hashes[b], b == 0 ? job.root : job.prompt_hashes[b - 1],
                         job.root};
      pool_.publish(job.base.blocks[b], key,
                    std::span<const TokenId>(job.prompt)
                        .subspan(b * static_cast<size_t>(bt), static_cast<size_t>(bt)));
    }
    return;
  }
  SampleRun& s = job.samples[static_cast<size_t>(sample)];
  KvSequence& seq = s.seq;
  std::vector<TokenId> tokens(static_cast<size_t>(bt));
  while (static_cast<int64_t>(s.hashes.size() + 1) * bt <= seq.n_tokens) {
    const size_t b = s.hashes.size();
    for (int k = 0; k < bt; ++k) {
      tokens[static_cast<size_t>(k)] = job.token_at(s, static_cast<int64_t>(b) * bt + k);
    }
    const BlockHash parent = b == 0 ? job.root : s.hashes.back();
    const BlockKey key{block_hash(parent, tokens), parent, job.root};
    pool_.publish(seq.blocks[b], key, tokens);
    s.hashes.push_back(key.hash);
  }
}

// ---- Freeing ---------------------------------------------------------------------

void Scheduler::release_kv(Job& job) {
  job.base.release(pool_);
  job.base_published = 0;
  for (SampleRun& s : job.samples) {
    s.seq.release(pool_);
    s.hashes.clear();
  }
}

}  // namespace encore
