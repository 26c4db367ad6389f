// Continuous batching (see scheduler.h).
#include "engine/scheduler.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "encore/error.h"
#include "encore/run_state.h"

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

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Scheduler::Scheduler(ForwardContext& ctx, const Tokenizer& tokenizer, int32_t batch_tokens,
                     bool prefix_cache, Persistence* persist)
    : ctx_(ctx),
      pool_(ctx.pool()),
      tok_(tokenizer),
      batch_tokens_(batch_tokens),
      prefix_cache_(prefix_cache),
      persist_(prefix_cache ? persist : nullptr),
      n_vocab_(ctx.model().hparams().n_vocab) {}

Scheduler::~Scheduler() { cancel_all(); }

void Scheduler::add(std::unique_ptr<Job> job) {
  Job* j = job.get();
  jobs_.push_back(std::move(job));
  if (j->max_tokens == 0 || j->n_active() == 0) {  // nothing to generate
    for (size_t i = 0; i < j->samples.size(); ++i) {
      if (j->samples[i].active) finish_sample(*j, static_cast<int>(i), FinishReason::Length);
    }
    complete(*j, Response::Status::Ok);
    remove(*j);
    return;
  }
  insert_sorted(waiting_, j);
}

void Scheduler::cancel_all() { end_all(Response::Status::Cancelled, {}); }

void Scheduler::end_all(Response::Status status, const std::string& error) {
  while (!jobs_.empty()) {
    Job& job = *jobs_.back();
    complete(job, status, error);
    remove(job);
  }
  done_.clear();
  entries_.clear();
  planned_.clear();
}

void Scheduler::iterate() {
  drop_cancelled();
  plan();
  if (!entries_.empty()) run_step();
  for (Job* job : done_) remove(*job);
  done_.clear();
  counters_.requests_running = static_cast<int64_t>(running_.size());
  counters_.requests_waiting = static_cast<int64_t>(waiting_.size());
}

void Scheduler::drop_cancelled() {
  std::vector<Job*> cancelled;
  for (const auto& job : jobs_) {
    if (job->shared->cancel.load(std::memory_order_relaxed)) cancelled.push_back(job.get());
  }
  for (Job* job : cancelled) {
    complete(*job, Response::Status::Cancelled);
    remove(*job);
  }
}

// ---- Planning ------------------------------------------------------------------

void Scheduler::plan() {
  budget_ = batch_tokens_;
  entries_.clear();
  planned_.clear();
  const int64_t preemptions_before = counters_.preemptions;
  // Decodes first, then prompt chunks, each pass in priority-then-age order:
  // a long prompt never stalls the streams that are already generating.
  // plan_job may preempt any later-ordered job (or the job itself), so the
  // passes walk a snapshot and skip jobs that left the running state.
  const std::vector<Job*> order = running_;
  for (const bool decode : {true, false}) {
    for (Job* job : order) {
      if (budget_ == 0) break;
      if (job->completed || job->phase == Job::Phase::Waiting) continue;
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
    const auto count = static_cast<int32_t>(std::min<int64_t>(p - n, budget_));
    if (count == 0) return true;
    if (!reserve(job, job.base, n + count)) return false;
    const bool last = n + count == p;
    entries_.push_back({&job.base, std::span<const TokenId>(job.prompt).subspan(n, count),
                        last ? std::span<float>(job.base_logits) : std::span<float>()});
    planned_.push_back({&job, -1, count, last});
    budget_ -= count;
    return true;
  }
  assert(job.phase == Job::Phase::Decode);
  const auto p = static_cast<int64_t>(job.prompt.size());
  for (size_t i = 0; i < job.samples.size() && budget_ > 0; ++i) {
    SampleRun& s = job.samples[i];
    if (!s.active) continue;
    const int64_t n = s.seq.n_tokens, total = job.total_tokens(s);
    assert(total > n && n >= p);
    const auto count = static_cast<int32_t>(std::min<int64_t>(total - n, budget_));
    if (!reserve(job, s.seq, n + count)) return false;
    const bool last = n + count == total;
    entries_.push_back({&s.seq, std::span<const TokenId>(s.state.ids).subspan(n - p, count),
                        last ? std::span<float>(s.logits) : std::span<float>()});
    planned_.push_back({&job, static_cast<int>(i), count, last});
    budget_ -= count;
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

// Preempts the newest running job that is not over. False when that was
// `job` itself.
bool Scheduler::make_room(Job& job) {
  for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
    if ((*it)->completed) continue;
    Job* victim = *it;
    preempt(*victim);
    return victim != &job;
  }
  assert(false && "no running job to preempt, yet the pool is full");
  return false;
}

// The prompt is evaluated: every active sample gets its own copy of the KV
// (full blocks shared, the partial last block copied; the last sample takes
// the prompt's sequence over), and those without ids yet sample their first
// token from the prompt's logits.
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
    if (s.state.ids.empty()) {
      s.logits = job.base_logits;
      advance(job, i);
      if (job.completed) return false;  // failed (NaN logits)
    } else {
      s.logits.assign(static_cast<size_t>(n_vocab_), 0.0f);  // filled by its last chunk
      extend_sample(job, i);
    }
  }
  job.base_logits = std::vector<float>();
  if (job.n_active() == 0) {
    complete(job, Response::Status::Ok);
    done_.push_back(&job);
    return false;
  }
  return true;
}

void Scheduler::preempt(Job& job) {
  // Entries of this step already planned for it go (their sequences are
  // about to be released).
  for (size_t e = planned_.size(); e-- > 0;) {
    if (planned_[e].job != &job) continue;
    budget_ += planned_[e].count;
    planned_.erase(planned_.begin() + static_cast<ptrdiff_t>(e));
    entries_.erase(entries_.begin() + static_cast<ptrdiff_t>(e));
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
  while (!waiting_.empty() && budget_ > 0) {
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
    const int64_t count = std::min<int64_t>(p - n, budget_);
    const int64_t need = kv_blocks_for_tokens(n + count, bt) - static_cast<int64_t>(hits.size());
    const int64_t watermark = running_.empty() ? 0 : std::max(1, pool_.n_blocks() / 100);
    if (need + watermark > pool_.n_free()) {
      for (auto b = hits.rbegin(); b != hits.rend(); ++b) pool_.release(*b);  // back to the cache
      if (running_.empty()) {
        // Nothing holds blocks that could come back: only blocks taken
        // outside the scheduler (a bug) could cause this. Fail the job
        // rather than wait for ever.
        complete(job, Response::Status::Failed,
                 fmt::format("the KV pool has {} free blocks; the prompt needs {}", pool_.n_free(),
                             need));
        waiting_.erase(waiting_.begin());
        done_.push_back(&job);
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

// ---- Running a step ---------------------------------------------------------------

void Scheduler::run_step() {
  try {
    ctx_.step(entries_);
  } catch (const std::exception& e) {
    // Nothing here should fail (requests were validated, blocks reserved);
    // if it does, the requests of this step end with the error and the
    // others go on.
    std::vector<Job*> failed;
    for (const Planned& p : planned_) {
      if (std::find(failed.begin(), failed.end(), p.job) == failed.end()) failed.push_back(p.job);
    }
    for (Job* job : failed) {
      complete(*job, Response::Status::Failed, fmt::format("forward step failed: {}", e.what()));
      done_.push_back(job);
    }
    return;
  }
  ++counters_.steps;
  after_step();
}

void Scheduler::after_step() {
  for (const Planned& p : planned_) {
    Job& job = *p.job;
    counters_.tokens_evaluated += p.count;
    if (job.completed) continue;  // failed earlier in this loop
    publish(job, p.sample);
    if (!p.logits) continue;
    if (p.sample < 0) {
      job.prompt_done = Clock::now();
      continue;  // forked when the job is next planned
    }
    advance(job, p.sample);
    if (job.n_active() == 0 && !job.completed) {
      complete(job, Response::Status::Ok);
      done_.push_back(&job);
    }
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

// ---- Sampling ------------------------------------------------------------------------

// Sample i has logits after its last token: draw the next one, as a
// sequential generation loop would (the reproducibility contract).
void Scheduler::advance(Job& job, int i) {
  SampleRun& s = job.samples[static_cast<size_t>(i)];
  if (job.max_tokens >= 0 && s.result.ids.size() >= static_cast<size_t>(job.max_tokens)) {
    finish_sample(job, i, FinishReason::Length);
    return;
  }
  const TokenId id = s.sampler->sample(s.logits);
  if (id < 0) {
    complete(job, Response::Status::Failed,
             fmt::format("every logit of generated token {} of sample {} is NaN: the model "
                         "file's weights are broken",
                         s.state.ids.size(), i));
    done_.push_back(&job);
    return;
  }
  if (!job.ignore_eos && tok_.is_eog(id)) {
    finish_sample(job, i, FinishReason::Eog);
    return;
  }
  std::optional<LogprobEntry> lp;
  if (job.logprobs >= 0) {
    lp = token_logprobs(s.logits, id, job.logprobs, ctx_.isa());
    s.result.logprobs.push_back(*lp);
  }
  s.sampler->accept(id);
  s.state.ids.push_back(id);
  s.result.ids.push_back(id);
  ++counters_.tokens_generated;
  ++job.response.usage.generated_tokens;
  if (!job.any_token) {
    job.any_token = true;
    job.response.ttft_seconds = seconds_between(job.submitted, Clock::now());
  }
  const StopText::Push pushed = s.stop.push(s.decoder->push(id));
  s.result.text += pushed.text;
  emit_token(job, i, id, pushed.text, lp);
  if (pushed.matched) {
    finish_sample(job, i, FinishReason::Stop);
    return;
  }
  // The context check comes first: a sample that ended at max_tokens always
  // fits its prompt and ids in the context, so it can be resumed.
  if (s.seq.n_tokens >= ctx_.n_ctx()) {
    finish_sample(job, i, FinishReason::Context);
    return;
  }
  // Done at max_tokens: the token is not evaluated (a resume recomputes the
  // KV from the ids anyway), which saves one step per call.
  if (job.max_tokens >= 0 && s.result.ids.size() >= static_cast<size_t>(job.max_tokens)) {
    finish_sample(job, i, FinishReason::Length);
  }
}

void Scheduler::finish_sample(Job& job, int i, FinishReason why) {
  SampleRun& s = job.samples[static_cast<size_t>(i)];
  s.active = false;
  s.result.finish = why;
  if (why != FinishReason::Length) s.state.finished = why;
  // Text held back is shown now. A sample that stopped at max_tokens keeps it
  // (and the decoder's partial bytes) in its state too, so a resumed run
  // continues matching stop strings across the pause; see SampleState.
  std::string text;
  if (why != FinishReason::Stop) text += s.stop.flush_shown();
  if (why != FinishReason::Stop && why != FinishReason::Length) text += s.decoder->finish();
  s.result.text += text;
  if (job.shared->stream) {
    Event e;
    e.kind = Event::Kind::Finish;
    e.sample = i;
    e.text = std::move(text);
    e.finish = why;
    job.shared->push(std::move(e));
  }
  if (persist_ && job.persist) persist_->capture(job, i);
  s.seq.release(pool_);
  s.logits = {};
}

// ---- Ending jobs ------------------------------------------------------------------------

void Scheduler::release_kv(Job& job) {
  job.base.release(pool_);
  job.base_published = 0;
  for (SampleRun& s : job.samples) {
    s.seq.release(pool_);
    s.hashes.clear();
  }
}

void Scheduler::complete(Job& job, Response::Status status, std::string error) {
  if (job.completed) return;
  job.completed = true;
  release_kv(job);
  const Clock::time_point now = Clock::now();
  Response& r = job.response;
  r.status = status;
  r.error = std::move(error);
  if (job.admitted_once) {
    r.queue_seconds = seconds_between(job.submitted, job.first_step);
    if (job.prompt_done != Clock::time_point{}) {
      r.prompt_seconds = seconds_between(job.first_step, job.prompt_done);
      r.generate_seconds = seconds_between(job.prompt_done, now);
    }
  }
  for (SampleRun& s : job.samples) {
    s.state.sampler = s.sampler->state();
    s.state.decoder = s.decoder->state();
    s.state.held_text = s.stop.held();
    s.state.held_shown = s.stop.shown();
    r.samples.push_back(std::move(s.result));
    r.states.push_back(std::move(s.state));
  }
  if (status == Response::Status::Ok && persist_ && !job.session.empty()) {
    Request saved = job.saved;
    if (job.continues_answer && !saved.messages.empty() &&
        saved.messages.back().role == "assistant") {
      saved.messages.back().content += r.samples[0].text;
    } else if (!saved.messages.empty()) {
      saved.messages.push_back({"assistant", r.samples[0].text});
    }
    persist_->save_session(job.tenant, job.session,
                           run_state_after(saved, r, persist_->fingerprint(), ctx_.n_ctx()));
  }
  switch (status) {
    case Response::Status::Ok:
      ++counters_.requests_finished;
      break;
    case Response::Status::Cancelled:
      ++counters_.requests_cancelled;
      break;
    case Response::Status::Failed:
      ++counters_.requests_failed;
      break;
  }
  job.shared->finish(std::move(r));
}

void Scheduler::remove(Job& job) {
  erase_from(running_, &job);
  erase_from(waiting_, &job);
  const auto it = std::find_if(jobs_.begin(), jobs_.end(),
                               [&](const std::unique_ptr<Job>& j) { return j.get() == &job; });
  if (it != jobs_.end()) jobs_.erase(it);
}

}  // namespace encore
