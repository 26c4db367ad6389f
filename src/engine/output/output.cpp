// Logits to answers: stage 3 of a step (see output.h).
#include "engine/output/output.h"

#include <fmt/format.h>

#include <algorithm>
#include <cassert>

#include "encore/run_state.h"
#include "encore/sampler.h"

namespace encore {
namespace {

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Queues a token event for sample i when the job streams.
void emit_token(Job& job, int i, TokenId id, std::string text,
                const std::optional<LogprobEntry>& lp) {
  if (!job.shared->stream) return;
  Event e;
  e.kind = Event::Kind::Token;
  e.sample = i;
  e.id = id;
  e.text = std::move(text);
  e.logprob = lp;
  job.shared->push(std::move(e));
}

}  // namespace

OutputProcessor::OutputProcessor(const Tokenizer& tokenizer, int32_t n_ctx, Isa isa,
                                 Persistence* persist, bool sync_sessions)
    : tok_(tokenizer), n_ctx_(n_ctx), isa_(isa), persist_(persist), sync_sessions_(sync_sessions) {}

void OutputProcessor::process(const StepPlan& plan, KvReleases& out) {
  for (const StepPlan::Entry& e : plan.entries) {
    Job& job = *e.job;
    if (!e.logits || job.completed) continue;  // a chunk, or failed earlier in this loop
    try {
      if (e.sample < 0) {
        job.prompt_done = Clock::now();
        first_tokens(job, out);
      } else {
        advance(job, e.sample, out);
      }
    } catch (const std::exception& ex) {  // e.g. out of memory: this request only
      complete(job, Response::Status::Failed, fmt::format("output failed: {}", ex.what()), out);
      continue;
    }
    if (job.n_active() == 0) complete(job, Response::Status::Ok, {}, out);
  }
}

void OutputProcessor::end(const StepPlan& plan, KvReleases& out) {
  for (const StepPlan::Ended& e : plan.ended) complete(*e.job, e.status, e.error, out);
}

void OutputProcessor::fail(const StepPlan& plan, const std::string& error, KvReleases& out) {
  for (const StepPlan::Entry& e : plan.entries) {
    complete(*e.job, Response::Status::Failed, error, out);  // once per job
  }
}

void OutputProcessor::finish_at_once(Job& job) {
  KvReleases none;  // the job never held KV
  for (size_t i = 0; i < job.samples.size(); ++i) {
    if (job.samples[i].active) finish_sample(job, static_cast<int>(i), FinishReason::Length, none);
  }
  complete(job, Response::Status::Ok, {}, none);
}

// The prompt is evaluated: each active sample without ids draws its first
// token from the prompt's logits. (Samples with ids, resumed or preempted,
// evaluate them first; the scheduler forks the KV at the next step.)
void OutputProcessor::first_tokens(Job& job, KvReleases& out) {
  for (size_t i = 0; i < job.samples.size(); ++i) {
    SampleRun& s = job.samples[i];
    if (!s.active || !s.state.ids.empty()) continue;
    s.logits = job.base_logits;  // sampling may change them; each sample draws from its own copy
    advance(job, static_cast<int>(i), out);
    if (job.completed) return;  // failed (NaN logits)
  }
  job.base_logits = std::vector<float>();
}

// Sample i has logits after its last token: draw the next one.
void OutputProcessor::advance(Job& job, int i, KvReleases& out) {
  SampleRun& s = job.samples[static_cast<size_t>(i)];
  if (job.max_tokens >= 0 && s.result.ids.size() >= static_cast<size_t>(job.max_tokens)) {
    finish_sample(job, i, FinishReason::Length, out);
    return;
  }
  // Every token of the sample is evaluated (its logits follow the last one).
  const int64_t evaluated = job.total_tokens(s);
  assert(evaluated == (job.phase == Job::Phase::Decode ? s.seq.n_tokens : job.base.n_tokens));
  const TokenId id = s.sampler->sample(s.logits);
  if (id < 0) {
    complete(job, Response::Status::Failed,
             fmt::format("every logit of generated token {} of sample {} is NaN: the model "
                         "file's weights are broken",
                         s.state.ids.size(), i),
             out);
    return;
  }
  if (!job.ignore_eos && tok_.is_eog(id)) {
    finish_sample(job, i, FinishReason::Eog, out);
    return;
  }
  std::optional<LogprobEntry> lp;
  if (job.logprobs >= 0) {
    lp = token_logprobs(s.logits, id, job.logprobs, isa_);
    // The text with the ids: no front end has to call back for it.
    lp->chosen.text = tok_.token_to_piece(id, true);
    for (TokenLogprob& t : lp->top) t.text = tok_.token_to_piece(t.id, true);
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
    finish_sample(job, i, FinishReason::Stop, out);
    return;
  }
  // The context check comes first: a sample that ended at max_tokens always
  // fits its prompt and ids in the context, so it can be resumed.
  if (evaluated >= n_ctx_) {
    finish_sample(job, i, FinishReason::Context, out);
    return;
  }
  // Done at max_tokens: the token is not evaluated (a resume recomputes the
  // KV from the ids anyway), which saves one step per call.
  if (job.max_tokens >= 0 && s.result.ids.size() >= static_cast<size_t>(job.max_tokens)) {
    finish_sample(job, i, FinishReason::Length, out);
  }
}

void OutputProcessor::finish_sample(Job& job, int i, FinishReason why, KvReleases& out) {
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
  out.push_back({&job, i});
  s.logits = {};
}

void OutputProcessor::complete(Job& job, Response::Status status, std::string error,
                               KvReleases& out) {
  if (job.completed) return;
  job.completed = true;
  out.push_back({&job, -1});
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
    const StreamDecoder::State decoder = s.decoder->state();
    s.state.decoder_pending = decoder.pending;
    s.state.decoder_strip_pending = decoder.strip_pending;
    s.state.held_text = s.stop.held();
    s.state.held_shown = s.stop.shown();
    r.samples.push_back(std::move(s.result));
    r.states.push_back(std::move(s.state));
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
  if (status == Response::Status::Ok && persist_ && !job.session.empty()) {
    Request saved = job.saved;
    if (job.continues_answer && !saved.messages.empty() &&
        saved.messages.back().role == "assistant") {
      saved.messages.back().content += r.samples[0].text;
    } else if (!saved.messages.empty()) {
      saved.messages.push_back({"assistant", r.samples[0].text});
    }
    RunState state = run_state_after(saved, r, persist_->fingerprint(), n_ctx_);
    state.session_seed = job.session_seed;
    state.turns = job.session_turns;
    state.generation = job.session_generation;
    if (sync_sessions_) {
      // The answer ends once the turn is in the tiers (its blocks were
      // queued before it): a replica that dies after answering has lost
      // nothing another replica needs to continue the session.
      auto shared = job.shared;
      auto response = std::make_shared<Response>(std::move(r));
      persist_->save_session(job.tenant, job.session, std::move(state),
                             [shared, response] { shared->finish(std::move(*response)); });
      return;
    }
    persist_->save_session(job.tenant, job.session, std::move(state));
  }
  job.shared->finish(std::move(r));
}

}  // namespace encore
