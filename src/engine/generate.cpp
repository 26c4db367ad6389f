// generate(): prefill once, fork the prompt's KV into n samples, then one
// batched forward step per position for every unfinished sample.
#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "encore/engine.h"
#include "encore/error.h"
#include "engine/stop_text.h"

namespace encore {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One sample of the request: its KV sequence, sampler, text state and output.
struct Slot {
  KvSequence seq;
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<StreamDecoder> decoder;
  StopText stop;
  SampleState state;
  SampleResult result;
  std::vector<float> logits;  // [n_vocab] after the sample's last evaluated token
  bool active = true;
  TokenId next = -1;  // the token to evaluate in this step
};

// Releases a sequence's blocks however generate() exits.
struct SeqGuard {
  KvBlockPool& pool;
  KvSequence seq;
  ~SeqGuard() { seq.release(pool); }
};

// Releases every sample's blocks however generate() exits.
struct SlotsGuard {
  KvBlockPool& pool;
  std::vector<Slot> slots;
  ~SlotsGuard() {
    for (Slot& s : slots) s.seq.release(pool);
  }
};

// Runs `ids` through `seq` in chunks; the last chunk's logits go to `logits`.
void prefill(ForwardContext& ctx, KvSequence& seq, std::span<const TokenId> ids, size_t chunk,
             std::span<float> logits) {
  for (size_t begin = 0; begin < ids.size(); begin += chunk) {
    const size_t count = std::min(chunk, ids.size() - begin);
    const bool last = begin + count == ids.size();
    const SeqTokens entry{&seq, ids.subspan(begin, count), last ? logits : std::span<float>()};
    ctx.step(std::span<const SeqTokens>(&entry, 1));
  }
}

int64_t blocks_for(int64_t tokens, int64_t bt) { return (tokens + bt - 1) / bt; }

// Sets up sample i from a saved state. The RNG counter, penalty window, UTF-8
// decoder and held stop text are functions of the prompt and the ids, so
// they are recomputed and must equal the saved copies: a file that was
// edited or belongs to another request is an error, never a silently
// different continuation.
void restore_sample(Slot& s, const SampleState& st, int i, const std::vector<TokenId>& prompt,
                    int n_vocab) {
  const auto fail = [&](const std::string& what) {
    return InvalidArgument(fmt::format("resume state of sample {}: {}", i, what));
  };
  for (TokenId id : st.ids) {
    if (id < 0 || id >= n_vocab) {
      throw fail(fmt::format("token id {} is outside the vocabulary [0, {})", id, n_vocab));
    }
  }
  if (st.finished == FinishReason::Length) {
    throw fail("finished = length is never saved (such a sample continues)");
  }
  s.sampler->accept_prompt(prompt);
  bool matched = false;
  for (size_t k = 0; k < st.ids.size(); ++k) {
    s.sampler->accept(st.ids[k]);
    const StopText::Push p = s.stop.push(s.decoder->push(st.ids[k]));
    if (p.matched && k + 1 != st.ids.size()) {
      throw fail(fmt::format("a stop string ends at generated token {}, yet more follow", k));
    }
    matched = matched || p.matched;
  }
  if (st.sampler.t != s.sampler->state().t || st.sampler.recent != s.sampler->state().recent) {
    throw fail(fmt::format(
        "its RNG counter ({}) or penalty window ({} ids) does not match its {} ids and the "
        "prompt: the file was edited or belongs to another request",
        st.sampler.t, st.sampler.recent.size(), st.ids.size()));
  }
  if (matched != (st.finished == FinishReason::Stop)) {
    throw fail(matched ? "its ids complete a stop string but it is not marked finished by stop"
                       : "it is marked finished by a stop string its ids do not contain");
  }
  s.state = st;
  s.active = !st.finished.has_value();
  if (!s.active) {  // nothing more to do; its text was flushed when it finished
    s.result.finish = *st.finished;
    return;
  }
  const StreamDecoder::State dec = s.decoder->state();
  if (st.decoder.pending != dec.pending || st.decoder.strip_pending != dec.strip_pending ||
      st.held_text != s.stop.held()) {
    throw fail(
        "its held text or decoder bytes do not match its ids: the file was edited or belongs to "
        "another request");
  }
  s.stop.restore(st.held_text, st.held_shown);
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Eog:
      return "eog";
    case FinishReason::Length:
      return "length";
    case FinishReason::Context:
      return "context";
    case FinishReason::Stop:
      return "stop";
  }
  return "?";
}

FinishReason finish_reason_from_name(std::string_view name) {
  for (FinishReason r :
       {FinishReason::Eog, FinishReason::Length, FinishReason::Context, FinishReason::Stop}) {
    if (name == finish_reason_name(r)) return r;
  }
  throw InvalidArgument(
      fmt::format("unknown finish reason '{}' (expected eog, length, context or stop)", name));
}

void GenerateParams::validate(int n_vocab) const {
  sampling.validate(n_vocab);
  if (n_predict < -1) throw InvalidArgument(fmt::format("n_predict {} must be >= -1", n_predict));
  if (n_samples < 1 || n_samples > kMaxSamples) {
    throw InvalidArgument(fmt::format("n (samples) {} must be in [1, {}]", n_samples, kMaxSamples));
  }
  if (logprobs < -1 || logprobs > kMaxTopLogprobs) {
    throw InvalidArgument(
        fmt::format("logprobs {} must be in [0, {}] (or -1: none)", logprobs, kMaxTopLogprobs));
  }
  if (prefill_chunk < 1) {
    throw InvalidArgument(fmt::format("prefill chunk size {} must be at least 1", prefill_chunk));
  }
  if (stop.size() > kMaxStopStrings) {
    throw InvalidArgument(
        fmt::format("{} stop strings given; at most {}", stop.size(), kMaxStopStrings));
  }
  for (const std::string& s : stop) {
    if (s.empty() || s.size() > kMaxStopBytes) {
      throw InvalidArgument(
          fmt::format("a stop string has {} bytes; it must have 1 to {}", s.size(), kMaxStopBytes));
    }
    // The text it is matched in is valid UTF-8; an invalid stop string could
    // match inside a character and cut the text there.
    if (!is_valid_utf8(s)) throw InvalidArgument("a stop string is not valid UTF-8");
  }
}

std::string output_hash(const std::vector<TokenId>& ids) {
  std::vector<uint8_t> bytes;  // little-endian int32 per id, whatever the host order
  bytes.reserve(ids.size() * 4);
  for (TokenId id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int b = 0; b < 4; ++b) bytes.push_back(static_cast<uint8_t>(u >> (8 * b)));
  }
  return fmt::format("{:016x}", XXH3_64bits(bytes.data(), bytes.size()));
}

GenerateResult generate(ForwardContext& ctx, const Tokenizer& tokenizer,
                        const std::vector<TokenId>& prompt_ids, const GenerateParams& params,
                        const TextCallback& on_text, const std::vector<SampleState>* resume) {
  if (prompt_ids.empty())
    throw InvalidArgument("generate: the prompt has no tokens (not even BOS)");
  const int n_vocab = ctx.model().hparams().n_vocab;
  if (tokenizer.n_vocab() != n_vocab) {
    throw InvalidArgument(
        fmt::format("the tokenizer has {} tokens but the model's vocabulary is {}",
                    tokenizer.n_vocab(), n_vocab));
  }
  params.validate(n_vocab);
  const int32_t n_ctx = ctx.n_ctx();
  if (static_cast<int64_t>(prompt_ids.size()) > n_ctx) {
    throw InvalidArgument(fmt::format(
        "the prompt has {} tokens but the context size is {}: shorten the prompt or raise the "
        "context size",
        prompt_ids.size(), n_ctx));
  }
  const int n = params.n_samples;
  if (resume && resume->size() != static_cast<size_t>(n)) {
    throw InvalidArgument(
        fmt::format("resume state has {} samples but the request asks for {}", resume->size(), n));
  }
  SamplingParams sp = params.sampling;
  if (sp.repeat_last_n < 0) sp.repeat_last_n = n_ctx;

  // Fail before the first token rather than halfway through the output: each
  // sample may fill the whole context unless n_predict bounds it. Without a
  // resume the prompt's full blocks are shared by every sample.
  KvBlockPool& pool = ctx.pool();
  const int64_t bt = pool.layout().block_tokens;
  const auto prompt_len = static_cast<int64_t>(prompt_ids.size());
  // Peak use: the prompt's full blocks (shared), plus per running sample the
  // blocks past them (a fork copies the prompt's partial block).
  int64_t need_blocks = prompt_len / bt;
  for (int i = 0; i < n; ++i) {
    // A finished sample (eog, stop, context) is not recomputed: it needs no
    // blocks, and one that filled the context holds n_ctx + 1 ids.
    if (resume && (*resume)[i].finished) continue;
    const int64_t done = resume ? static_cast<int64_t>((*resume)[i].ids.size()) : 0;
    if (resume && prompt_len + done > n_ctx) {
      throw InvalidArgument(fmt::format(
          "resume state of sample {}: prompt ({}) + generated ({}) tokens exceed the context "
          "size {}",
          i, prompt_len, done, n_ctx));
    }
    int64_t tokens = n_ctx;
    if (params.n_predict >= 0)
      tokens = std::min<int64_t>(n_ctx, prompt_len + done + params.n_predict);
    need_blocks += blocks_for(tokens, bt) - prompt_len / bt;
  }
  if (need_blocks > pool.n_free()) {
    throw ResourceExhausted(fmt::format(
        "the KV cache has room for {} tokens ({} free blocks of {}) but this request ({} "
        "sample(s), context size {}) may need {} blocks: raise the KV cache budget, lower the "
        "context size, -n or n",
        static_cast<int64_t>(pool.n_free()) * bt, pool.n_free(), bt, n, n_ctx, need_blocks));
  }

  GenerateResult out;
  SlotsGuard guard{pool, {}};
  guard.slots.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    Slot& s = guard.slots[i];
    s.sampler = std::make_unique<Sampler>(sp, params.seed, static_cast<uint32_t>(i), ctx.isa());
    s.decoder = std::make_unique<StreamDecoder>(tokenizer, params.strip_leading_space);
    s.stop = StopText(params.stop);
    s.logits.resize(static_cast<size_t>(n_vocab));
    if (resume) restore_sample(s, (*resume)[i], i, prompt_ids, n_vocab);
    if (!resume) s.sampler->accept_prompt(prompt_ids);
  }

  auto start = std::chrono::steady_clock::now();
  const size_t chunk = static_cast<size_t>(params.prefill_chunk);
  bool any_active = false;
  for (const Slot& s : guard.slots) any_active = any_active || s.active;
  if (params.n_predict != 0 && any_active) {
    // The prompt runs once; each sample forks its KV, then (resuming) runs
    // its own ids. Chunk invariance makes this the same bits as running
    // prompt + ids in one go.
    SeqGuard base{pool, {}};
    std::vector<float> base_logits(static_cast<size_t>(n_vocab));  // [n_vocab]
    prefill(ctx, base.seq, prompt_ids, chunk, base_logits);
    // Every running sample but the last forks the prompt; the last takes it
    // over (forks first: they copy the prompt's partial block as it is).
    int last = n - 1;
    while (!guard.slots[last].active) --last;
    for (int i = 0; i < last; ++i) {
      if (guard.slots[i].active) guard.slots[i].seq = base.seq.fork(pool);
    }
    std::swap(guard.slots[last].seq, base.seq);
    for (Slot& s : guard.slots) {
      if (!s.active) continue;
      if (!s.state.ids.empty()) {
        prefill(ctx, s.seq, s.state.ids, chunk, s.logits);
      } else {
        s.logits = base_logits;
      }
    }
  }
  out.prompt_seconds = seconds_since(start);

  start = std::chrono::steady_clock::now();
  auto emit = [&](int i, TokenId id, const std::string& text) {
    if (text.empty()) return;
    guard.slots[i].result.text += text;
    if (on_text) on_text(i, id, text);
  };
  auto finish = [&](int i, FinishReason why) {
    Slot& s = guard.slots[i];
    s.active = false;
    s.result.finish = why;
    if (why != FinishReason::Length) s.state.finished = why;
  };
  std::vector<SeqTokens> batch;
  batch.reserve(static_cast<size_t>(n));
  for (;;) {
    batch.clear();
    for (int i = 0; i < n; ++i) {
      Slot& s = guard.slots[i];
      if (!s.active) continue;
      if (params.n_predict >= 0 && s.result.ids.size() >= static_cast<size_t>(params.n_predict)) {
        finish(i, FinishReason::Length);
        continue;
      }
      const TokenId id = s.sampler->sample(s.logits);
      if (id < 0) {
        throw ModelError(fmt::format(
            "every logit of generated token {} of sample {} is NaN: the model file's weights are "
            "broken",
            s.state.ids.size(), i));
      }
      if (tokenizer.is_eog(id)) {
        finish(i, FinishReason::Eog);
        continue;
      }
      if (params.logprobs >= 0) {
        s.result.logprobs.push_back(token_logprobs(s.logits, id, params.logprobs, ctx.isa()));
      }
      s.sampler->accept(id);
      s.state.ids.push_back(id);
      s.result.ids.push_back(id);
      const StopText::Push p = s.stop.push(s.decoder->push(id));
      emit(i, id, p.text);
      if (p.matched) {
        finish(i, FinishReason::Stop);
        continue;
      }
      // The context check comes first: a sample that ended at -n always
      // fits its prompt and ids in the context, so it can be resumed.
      if (s.seq.n_tokens >= n_ctx) {
        finish(i, FinishReason::Context);
        continue;
      }
      // Done at -n: the token is not evaluated (a resume recomputes the KV
      // from the ids anyway), which saves one step per call.
      if (params.n_predict >= 0 && s.result.ids.size() >= static_cast<size_t>(params.n_predict)) {
        finish(i, FinishReason::Length);
        continue;
      }
      s.next = id;
      batch.push_back({&s.seq, std::span<const TokenId>(&s.next, 1), s.logits});
    }
    if (batch.empty()) break;
    ctx.step(batch);
  }
  // Text still held back is shown now. A sample that stopped at -n keeps it
  // (and the decoder's partial bytes) in its state too, so a resumed run
  // continues matching stop strings across the pause; see SampleState.
  for (int i = 0; i < n; ++i) {
    Slot& s = guard.slots[i];
    const TokenId last = s.result.ids.empty() ? -1 : s.result.ids.back();
    const FinishReason why = s.result.finish;
    if (why != FinishReason::Stop) emit(i, last, s.stop.flush_shown());
    if (why != FinishReason::Stop && why != FinishReason::Length) {
      emit(i, last, s.decoder->finish());
    }
    s.state.sampler = s.sampler->state();
    s.state.decoder = s.decoder->state();
    s.state.held_text = s.stop.held();
    s.state.held_shown = s.stop.shown();
  }
  out.generate_seconds = seconds_since(start);
  for (Slot& s : guard.slots) {
    out.samples.push_back(std::move(s.result));
    out.states.push_back(std::move(s.state));
  }
  return out;
}

}  // namespace encore
