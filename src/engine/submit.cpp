// Engine::submit's half on the caller's thread: every check of a request,
// once, with errors that name the field; the prompt rendered and tokenized;
// the samplers set up (and checked against a resume state). What reaches the
// scheduler is a Job that can run.
#include <fmt/format.h>
#include <sys/random.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>

#include "encore/chat_template.h"
#include "encore/error.h"
#include "encore/seed.h"
#include "engine/engine_impl.h"
#include "engine/normalize.h"
#include "util/text.h"

namespace encore {
namespace {

int64_t blocks_for(int64_t tokens, int64_t bt) { return (tokens + bt - 1) / bt; }

constexpr size_t kMaxShownBytes = 64;  // of a client's string quoted in a message

// A seed nobody chose: drawn from the OS entropy source (getrandom(2), not
// std::random_device, whose source is implementation-defined) and reported
// back in the Response, so that the output can be reproduced later.
uint64_t entropy_seed() {
  uint64_t seed = 0;
  auto* p = reinterpret_cast<unsigned char*>(&seed);
  size_t got = 0;
  while (got < sizeof seed) {
    const ssize_t r = getrandom(p + got, sizeof seed - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      throw InvalidArgument(
          std::string(settings::kSeed.name),
          fmt::format("none given and none can be drawn from the OS (getrandom: {}): give one",
                      std::strerror(errno)));
    }
    got += static_cast<size_t>(r);
  }
  return seed & kSeedMask;  // read back exactly from JSON as a double (seed.h)
}

// Token ids of a prompt text: BOS/EOS as the model's metadata asks (add_bos /
// add_eos), as llama.cpp tokenizes prompts. An empty prompt means BOS only.
// special_ranges: where special-token text may be parsed (null: everywhere,
// when parse_special).
std::vector<TokenId> encode_prompt(const Tokenizer& tok, const std::string& text,
                                   bool parse_special, const std::vector<TextRange>* special_ranges,
                                   std::vector<std::string>* notes) {
  Tokenizer::EncodeOptions enc;
  enc.add_bos = tok.vocab().add_bos;
  enc.add_eos = tok.vocab().add_eos;
  enc.parse_special = parse_special;
  enc.special_ranges = special_ranges;
  std::vector<TokenId> ids = tok.encode(text, enc);
  const TokenId bos = tok.vocab().bos;
  if (enc.add_bos && ids.size() >= 2 && ids[0] == bos && ids[1] == bos) {
    // The text began with the BOS token's own text (special tokens parsed).
    ids.erase(ids.begin());
    notes->push_back("the prompt starts with the BOS text; not adding a second BOS");
  }
  if (ids.empty() || (text.empty() && ids.front() != bos)) {
    if (bos < 0) {
      throw InvalidArgument("prompt",
                            "it is empty and the vocabulary has no BOS token to start with");
    }
    ids.insert(ids.begin(), bos);
  }
  return ids;
}

// Fails now rather than halfway through the output: the request must fit
// the KV pool on its own.
void check_fits_pool(const Request& r, int64_t p, int32_t n_ctx, const KvBlockPool& pool) {
  if (!r.resume.empty() && r.resume.size() != static_cast<size_t>(r.n)) {
    throw InvalidArgument("resume", fmt::format("{} sample states but the request asks for n = {}",
                                                r.resume.size(), r.n));
  }
  // Alone in the pool, each sample may fill the context unless max_tokens
  // bounds it; the prompt's full blocks are shared.
  const int64_t bt = pool.layout().block_tokens;
  int64_t need_blocks = p / bt;
  for (int i = 0; i < r.n; ++i) {
    const SampleState* st = r.resume.empty() ? nullptr : &r.resume[static_cast<size_t>(i)];
    if (st && st->finished) continue;  // nothing more to do: no KV
    const int64_t done = st ? static_cast<int64_t>(st->ids.size()) : 0;
    if (p + done > n_ctx) {
      throw InvalidArgument(
          fmt::format("resume[{}]", i),
          fmt::format("prompt ({}) + generated ({}) tokens exceed the context size {}", p, done,
                      n_ctx));
    }
    int64_t tokens = n_ctx;
    if (r.max_tokens >= 0) tokens = std::min<int64_t>(n_ctx, p + done + r.max_tokens);
    need_blocks += blocks_for(tokens, bt) - p / bt;
  }
  if (need_blocks > pool.n_blocks()) {
    throw ResourceExhausted(fmt::format(
        "the KV cache holds {} tokens ({} blocks of {}) but this request ({} sample(s), context "
        "size {}) may need {} blocks: raise the KV cache budget, lower the context size, "
        "max_tokens or n",
        static_cast<int64_t>(pool.n_blocks()) * bt, pool.n_blocks(), bt, r.n, n_ctx, need_blocks));
  }
}

// What the session record keeps of the request (no prompt text).
void keep_for_session(Job& job, const Request& r, Engine::Impl::SessionStart& start) {
  if (r.session.empty()) return;
  job.saved.sampling = r.sampling;
  job.saved.n = r.n;
  job.saved.logprobs = r.logprobs;
  job.saved.stop = r.stop;
  job.saved.ignore_eos = r.ignore_eos;
  job.saved.messages = r.messages;  // the answer is added when it is known
  job.saved.chat_template = r.chat_template;
  if (start.continues_answer) {
    job.saved.messages = std::move(start.history);
    job.saved.chat_template = std::move(start.chat_template);
    job.continues_answer = true;
  }
}

}  // namespace

// A request naming a saved session: without a prompt it becomes that
// session's continuation (its request and sample states, as a resume), and
// without a usable saved session it fails (NotFound: there is nothing to
// continue); with a text or ids prompt, the prompt is appended to the
// session's conversation (its prompt and sample 0's ids). Messages are
// rendered whole as always. With a prompt, found is false when there is no
// usable saved session: the session starts afresh.
Engine::Impl::SessionStart Engine::Impl::continue_session(Request& r) {
  if (!valid_session_id(r.session)) {  // quoted clipped: it may be megabytes of anything
    throw InvalidArgument("session",
                          fmt::format("'{}' is not a session id (one is {})",
                                      util::printable(r.session, kMaxShownBytes), kSessionIdRule));
  }
  if (!persist) {
    throw InvalidArgument(
        "session", "this engine has no state tiers (give it a state directory or a Redis URL)");
  }
  const bool no_prompt = r.prompt.empty() && r.prompt_ids.empty() && r.messages.empty();
  SessionLoad load = persist->load_session(r.tenant, r.session, no_prompt);
  SessionStart start;
  if (!load.state) {
    if (no_prompt) {
      throw NotFound("session",
                     fmt::format("{}; send a prompt to start it{}", load.why(r.session),
                                 load.absent == SessionLoad::Absent::Missing ? "" : " afresh"));
    }
    if (load.absent != SessionLoad::Absent::Missing && options.log) {
      options.log(
          fmt::format("state: {}; starting it afresh with the prompt", load.why(r.session)));
    }
    return start;
  }
  std::optional<RunState>& saved = load.state;
  start.found = true;
  Request& s = saved->request;
  // A new turn's seed is the session's seed + the turn's index, as `encore
  // chat` counts them: the same conversation gives the same answers on any
  // replica without the client repeating seeds, and a chat turn sent again
  // (the whole conversation each time) gets the same seed again. An
  // explicit seed still wins. A record from before these counts: its seed
  // stands for the session's, its turn for the first.
  start.session_seed = saved->session_seed ? saved->session_seed : s.seed;
  const int64_t turns = std::max<int64_t>(saved->turns, 1);
  start.turns = turns + (no_prompt ? 0 : 1);
  start.generation = saved->generation;
  if (!no_prompt && !r.seed && start.session_seed) {
    const int64_t index =
        r.messages.empty() ? turns : std::max<int64_t>(user_turns(r.messages) - 1, 0);
    start.turn_seed = *start.session_seed + static_cast<uint64_t>(index);  // wraps: any is one
  }
  if (no_prompt) {
    if (saved->n_ctx != info.n_ctx) {
      throw InvalidArgument(
          "session",
          fmt::format("'{}' ran with context size {}; this engine has {}, which would end it "
                      "elsewhere",
                      r.session, saved->n_ctx, info.n_ctx));
    }
    s.max_tokens = r.max_tokens;
    s.logprobs = std::max(s.logprobs, r.logprobs);
    s.stream = r.stream;
    s.tenant = r.tenant;
    s.priority = r.priority;
    s.session = r.session;
    s.persist = r.persist;
    // A chat's conversation is history, not a prompt: the ids are. The
    // continued text extends its last answer.
    start.history = std::move(s.messages);
    start.chat_template = std::move(s.chat_template);
    start.continues_answer = !start.history.empty();
    s.messages.clear();
    s.chat_template.clear();
    r = std::move(s);
    return start;
  }
  if (!r.messages.empty()) return start;
  std::vector<TokenId> ids = s.prompt_ids;
  if (!s.resume.empty()) ids.insert(ids.end(), s.resume[0].ids.begin(), s.resume[0].ids.end());
  std::vector<TokenId> added = r.prompt_ids;
  if (added.empty()) {
    Tokenizer::EncodeOptions enc;  // mid-conversation: no BOS
    enc.parse_special = r.parse_special;
    added = tokenizer->encode(r.prompt, enc);
  }
  ids.insert(ids.end(), added.begin(), added.end());
  r.prompt.clear();
  r.prompt_ids = std::move(ids);
  return start;
}

// The prompt's ids, from text, ids or messages (rendered with the chat
// template), checked against the vocabulary and the context.
std::vector<TokenId> Engine::Impl::prompt_of(Request& r, Response* resp) {
  std::vector<TokenId> prompt;
  const bool chat = !r.messages.empty() || !r.chat_template.empty();
  if (int{!r.prompt.empty()} + int{!r.prompt_ids.empty()} + int{!r.messages.empty()} > 1) {
    throw InvalidArgument("prompt", "give the prompt as text, as ids or as messages, not several");
  }
  if (chat && r.messages.empty()) {
    throw InvalidArgument("messages", "a chat template was named but there are no messages");
  }
  if (chat && r.parse_special) {
    throw InvalidArgument(std::string(settings::kParseSpecial.name),
                          "message content is always plain text (only the chat template's own "
                          "markers are special tokens); parse_special is for text prompts");
  }
  if (chat && r.chat_template.empty()) {
    // The model's own Jinja template (or --chat-template-file's).
    if (!chat_jinja) {
      throw InvalidArgument(
          "messages",
          chat_jinja_error.empty()
              ? fmt::format("{} has no tokenizer.chat_template; pass --chat-template NAME (one of: "
                            "{}) or --chat-template-file FILE",
                            info.model_path, chat_template_names())
              : fmt::format("{}; pass --chat-template NAME (one of: {}) or --chat-template-file "
                            "FILE",
                            chat_jinja_error, chat_template_names()));
    }
    resp->chat_template = chat_jinja_origin;
    resp->chat_template_hash = chat_jinja_hash;
    const RenderedChat rendered =
        render_jinja_chat(*chat_jinja, r.messages, true, tokenizer->vocab(), options.template_now);
    resp->prompt_text = rendered.text;
    prompt =
        encode_prompt(*tokenizer, rendered.text, true, &rendered.template_ranges, &resp->notes);
  } else if (chat) {
    const ChatTemplate family = chat_template_from_name(r.chat_template);
    resp->chat_template = std::string(chat_template_name(family));
    // Rendered without BOS (the tokenizer adds it per add_bos) and tokenized
    // with special tokens parsed only in the template's own text: message
    // content is plain text, whatever it spells (chat_template.h).
    const RenderedChat rendered = render_chat_prompt(family, r.messages, true, tokenizer->vocab());
    resp->prompt_text = rendered.text;
    prompt =
        encode_prompt(*tokenizer, rendered.text, true, &rendered.template_ranges, &resp->notes);
  } else if (!r.prompt_ids.empty()) {
    for (size_t i = 0; i < r.prompt_ids.size(); ++i) {
      if (r.prompt_ids[i] < 0 || r.prompt_ids[i] >= info.n_vocab) {
        throw InvalidArgument(fmt::format("prompt_ids[{}]", i),
                              fmt::format("token id {} is outside the vocabulary [0, {})",
                                          r.prompt_ids[i], info.n_vocab));
      }
    }
    prompt = std::move(r.prompt_ids);
  } else {
    prompt = encode_prompt(*tokenizer, r.prompt, r.parse_special, nullptr, &resp->notes);
  }
  const auto p = static_cast<int64_t>(prompt.size());
  if (p > info.n_ctx) {
    throw InvalidArgument(
        "prompt",
        fmt::format("{} tokens but the context size is {}: shorten the prompt or raise the context "
                    "size",
                    p, info.n_ctx));
  }
  return prompt;
}

// The samples' samplers (the seed derived or drawn if none was given),
// decoders and stop strings, fresh or restored from the request's resume
// states.
void Engine::Impl::make_samples(Job& job, Request& r, const std::optional<uint64_t>& turn_seed) {
  const std::vector<TokenId>& prompt = job.prompt;
  const auto p = static_cast<int64_t>(prompt.size());
  if (r.seed) {
    job.response.seed_source = SeedSource::Given;
  } else if (turn_seed) {
    r.seed = *turn_seed;
    job.response.seed_source = SeedSource::Session;
    ++seeds_session;
  } else if (!options.seed_secret.empty()) {
    // From the ids the engine evaluates (a session's merged ones included),
    // so the seed follows what the model sees, not how it was sent.
    r.seed = derive_seed(options.seed_secret, r.tenant, prompt);
    job.response.seed_source = SeedSource::Derived;
    ++seeds_derived;
  } else {
    r.seed = entropy_seed();
    job.response.seed_source = SeedSource::Drawn;
    ++seeds_drawn;
  }
  SamplingParams sp = r.sampling;
  if (sp.repeat_last_n < 0) sp.repeat_last_n = info.n_ctx;
  // The SPM dummy-prefix space of the first generated piece is dropped when
  // the prompt is BOS only, as llama.cpp renders it.
  const bool strip = p == 1 && prompt[0] == tokenizer->vocab().bos;
  job.samples.resize(static_cast<size_t>(r.n));
  for (int i = 0; i < r.n; ++i) {
    SampleRun& s = job.samples[static_cast<size_t>(i)];
    s.sampler = std::make_unique<Sampler>(sp, *r.seed, static_cast<uint32_t>(i), info.isa);
    s.decoder = std::make_unique<StreamDecoder>(*tokenizer, strip);
    s.stop = StopText(r.stop);
    if (r.resume.empty()) {
      s.sampler->accept_prompt(prompt);
    } else {
      restore_sample(s, r.resume[static_cast<size_t>(i)], i, prompt, info.n_vocab);
    }
  }
}

std::unique_ptr<Job> Engine::Impl::make_job(Request r) {
  r.validate(info.n_vocab);
  // Before a session merges the text into its ids: appended text is
  // normalized too.
  if (r.normalize_input) normalize_request_text(r);
  auto job = std::make_unique<Job>();
  Response& resp = job->response;
  resp.prompt_text = r.prompt;  // a chat's is the rendered text (prompt_of)
  SessionStart start;
  if (!r.session.empty()) {
    start = continue_session(r);
    resp.session_found = start.found;
    if (start.found) r.validate(info.n_vocab);  // a stored request is checked like any
  }
  job->prompt = prompt_of(r, &resp);
  const std::vector<TokenId>& prompt = job->prompt;
  const auto p = static_cast<int64_t>(prompt.size());
  check_fits_pool(r, p, info.n_ctx, *pool);
  make_samples(*job, r, start.turn_seed);

  job->priority = r.priority;
  job->tenant = r.tenant;
  job->session = r.session;
  job->persist = r.persist || !r.session.empty();
  keep_for_session(*job, r, start);
  if (!r.session.empty()) {  // the counts the record this call saves carries (RunState)
    job->session_seed = start.session_seed.value_or(*r.seed);
    job->session_turns = start.turns;
    job->session_generation = start.generation + 1;
  }
  job->max_tokens = r.max_tokens;
  job->logprobs = r.logprobs;
  job->ignore_eos = r.ignore_eos;
  job->root = prefix_root(info.system_fingerprint, r.tenant);
  const int64_t bt = pool->layout().block_tokens;
  for (int64_t b = 0; b < p / bt; ++b) {
    job->prompt_hashes.push_back(
        block_hash(b == 0 ? job->root : job->prompt_hashes.back(),
                   std::span<const TokenId>(prompt).subspan(static_cast<size_t>(b * bt),
                                                            static_cast<size_t>(bt))));
  }
  job->shared = std::make_shared<RequestShared>();
  job->shared->stream = r.stream;
  job->shared->seed = *r.seed;
  job->shared->session_found = resp.session_found;
  resp.seed = *r.seed;
  resp.prompt_ids = prompt;
  resp.usage.prompt_tokens = p;
  // Counted once the request is known to run. The ids' bytes are hashed as
  // they lie in memory: the hash is compared within this process only.
  const bool client = r.tenant.empty() || r.tenant[0] != kInternalTenantMark;
  if (resp.seed_source == SeedSource::Given && client &&
      seed_reuse.given(r.tenant, *r.seed,
                       XXH3_64bits(prompt.data(), prompt.size() * sizeof(TokenId)))) {
    ++seeds_reused;
  }
  resp.effective = std::move(r);
  resp.effective.prompt.clear();
  resp.effective.messages.clear();
  resp.effective.chat_template.clear();
  resp.effective.parse_special = false;
  resp.effective.prompt_ids = prompt;
  job->submitted = Clock::now();
  return job;
}

}  // namespace encore
