// A request's runtime state (see job.h), and the plain-data helpers of
// request.h.
#include "engine/job.h"

#include <fmt/format.h>
#include <xxhash.h>

#include "encore/error.h"

namespace encore {

// ---- request.h -------------------------------------------------------------------

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

const char* seed_source_name(SeedSource s) {
  switch (s) {
    case SeedSource::Given:
      return "given";
    case SeedSource::Drawn:
      return "drawn";
    case SeedSource::Derived:
      return "derived";
    case SeedSource::Session:
      return "session";
  }
  return "?";
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

// ---- Job ----------------------------------------------------------------------------

size_t Job::n_active() const {
  size_t n = 0;
  for (const SampleRun& s : samples) n += s.active ? 1 : 0;
  return n;
}

TokenId Job::token_at(const SampleRun& s, int64_t pos) const {
  const auto p = static_cast<int64_t>(prompt.size());
  return pos < p ? prompt[static_cast<size_t>(pos)] : s.state.ids[static_cast<size_t>(pos - p)];
}

void restore_sample(SampleRun& s, const SampleState& st, int i, const std::vector<TokenId>& prompt,
                    int n_vocab) {
  const auto fail = [&](const std::string& what) {
    return InvalidArgument(fmt::format("resume[{}]: {}", i, what));
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
  if (st.decoder_pending != dec.pending || st.decoder_strip_pending != dec.strip_pending ||
      st.held_text != s.stop.held()) {
    throw fail(
        "its held text or decoder bytes do not match its ids: the file was edited or belongs to "
        "another request");
  }
  try {
    s.stop.restore(st.held_text, st.held_shown);
  } catch (const InvalidArgument& e) {
    throw fail(fmt::format("held_shown: {}", e.what()));
  }
}

}  // namespace encore
