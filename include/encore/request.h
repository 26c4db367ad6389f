// A request and what comes back: plain data shared by every front end
// (`encore run`, `encore batch`, the server) and the engine (engine.h).
//
// Reproducibility contract (docs/reproducibility.md): sample i of a request
// is a pure function of the model, the numerics settings (system
// fingerprint), the prompt ids, the sampling params, the stop strings, the
// context size, ignore_eos and (seed, i). It does not depend on n, the thread
// count, the ISA, the batch composition, the prefill chunking, prefix-cache
// hits, preemption, or on whether the generation was paused and resumed from
// a SampleState. The tenant and the priority change when and where a request
// runs, never what it produces.
//
// Ownership: plain values. Thread-safety: none needed (copied across threads).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "encore/chat_template.h"
#include "encore/sampler.h"
#include "encore/settings.h"

namespace encore {

enum class FinishReason {
  Eog,      // the model produced an end-of-generation token (EOS, EOT ...)
  Length,   // max_tokens tokens were generated
  Context,  // the context window is full
  Stop,     // a stop string appeared in the text
};
// "eog", "length", "context", "stop"; from_name throws InvalidArgument.
const char* finish_reason_name(FinishReason r);
FinishReason finish_reason_from_name(std::string_view name);

// Bounds on a request (checked at submission, errors name the field).
inline constexpr size_t kMaxStopStrings = 16;  // stop strings per request
inline constexpr size_t kMaxStopBytes = 256;   // bytes per stop string (bounds held text)
inline constexpr int kMaxTopLogprobs = static_cast<int>(settings::kLogprobs.max);  // per token
inline constexpr int kMaxSamples = static_cast<int>(settings::kN.max);             // n
inline constexpr size_t kMaxTenantBytes = 256;
// Tenants of the engine's own work (the server's consistency checks,
// src/server/shadow.h) begin with this byte, which no API-key tenant
// ([A-Za-z0-9_.-]) can: they are not clients, so their given seeds are not
// tracked for reuse (encore_seed_reuse_total).
inline constexpr char kInternalTenantMark = '\x1f';

// Session ids (Request::session): 1 to kMaxSessionBytes bytes of
// [A-Za-z0-9_.-], so that they are safe in file names, Redis keys and
// messages. The one definition of the rule: Engine::submit and the OpenAI
// request parser (openai.h, "session_id") both check it with this function,
// and their messages quote kSessionIdRule.
inline constexpr size_t kMaxSessionBytes = 128;
inline constexpr const char* kSessionIdRule = "1 to 128 bytes of [A-Za-z0-9_.-]";
constexpr bool valid_session_id(std::string_view id) {
  if (id.empty() || id.size() > kMaxSessionBytes) return false;
  for (const char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}
// The largest context size an engine accepts (bounds its scratch buffers).
inline constexpr int32_t kMaxContext = static_cast<int32_t>(settings::kCtxSize.max);

// Everything needed to continue one sample exactly where it stopped: plain
// data, saved and restored by the caller (`encore run --save-state` writes
// it as JSON, run_state.h).
struct SampleState {
  std::vector<TokenId> ids;  // generated so far (EOG excluded)
  SamplerState sampler;      // RNG counter and penalty window
  std::string held_text;     // decoded text held back: it may begin a stop string
  size_t held_shown = 0;     // bytes at its start already returned (a call that ended at
                             // max_tokens shows all its text; they are not returned again)
  // The text decoder's state (plain data, as the tokenizer's
  // StreamDecoder::State): bytes of an incomplete UTF-8 sequence (<= 3), and
  // whether the next piece's leading space is still to be stripped.
  std::string decoder_pending;
  bool decoder_strip_pending = false;
  std::optional<FinishReason> finished;  // eog, stop or context: nothing more to do
};

// One request: the one home of every field a front end sets. Validated once,
// at Engine::submit() (validate()), with errors that name the field
// (Error::field()). The numeric settings' defaults, ranges and help are the
// settings table's (settings.h, where visit_settings pairs them with the members).
struct Request {
  // The prompt: at most one of `prompt` (text), `prompt_ids` and `messages`.
  // Text is tokenized as llama.cpp does (BOS/EOS per the model's add_bos /
  // add_eos; special-token text such as "</s>" is plain text unless
  // parse_special); ids are used as they are; messages go through the chat
  // template (the model's, or the family named by chat_template), whose own
  // markers are special tokens while message content is always plain text
  // (chat_template.h); roles must be the family's. All empty: BOS only.
  std::string prompt;
  std::vector<TokenId> prompt_ids;
  std::vector<ChatMessage> messages;
  std::string chat_template;  // a family name (chat_template.h); implies chat
  // Text prompts only (also the text appended to a session): parse Control
  // token texts ("<s>", "<|im_start|>") in `prompt` as those tokens. Refused
  // with messages.
  bool parse_special = false;
  // Before tokenizing, trim leading and trailing whitespace from the prompt
  // text, each message's content and text appended to a session, and put
  // them in Unicode NFC (docs/serving.md, "Input normalisation"). Off by
  // default: it changes tokens. Text that is not valid UTF-8 is refused
  // (InvalidArgument naming the field) rather than passed on unnormalised.
  bool normalize_input = false;

  SamplingParams sampling;                 // repeat_last_n -1 = the context size
  std::optional<uint64_t> seed;            // absent: drawn or derived, reported in the Response
  int32_t n = settings::kN.int_default();  // samples; sample i draws from RNG stream i
                                           // whatever n is
  // Per sample; -1: until EOG, a stop string or the context.
  int32_t max_tokens = settings::kMaxTokens.int_default();
  std::vector<std::string> stop;  // matched in the text across token boundaries
  // -1: no logprobs; 0: the chosen token's; N: also the N most likely tokens.
  int32_t logprobs = settings::kLogprobs.int_default();
  bool ignore_eos = false;  // EOG tokens are generated like any other (benchmarks)

  // Who asks: salts the prefix cache (requests of different tenants never
  // share KV) and, later, session keys. Never changes the output.
  std::string tenant;
  int32_t priority = 0;  // higher runs first; first come, first served within a priority
  bool stream = false;   // deliver Events through the handle as tokens come

  // A session (the engine's state tiers, engine.h): when one is saved under
  // (tenant, session), a request without a prompt continues its generation
  // exactly (as `resume` would), and a text or ids prompt is appended to its
  // conversation (the saved prompt and sample 0's ids), so only the new
  // tokens are evaluated; messages are rendered whole as always. When none
  // is saved (or it cannot be used), a request with a prompt starts the
  // session and one without fails at submit with NotFound (error.h). A
  // saved session whose KV blocks are gone still continues (recomputed).
  // When the request ends, the session (ids, sampler states) and its KV
  // blocks are written out. "" means none; otherwise valid_session_id() must hold.
  std::string session;
  // Write this request's KV blocks to the state tiers at the end (a session
  // implies it), so a later resume restores them instead of recomputing.
  bool persist = false;

  // Continue these samples ([n] entries, from an earlier Response with the
  // same prompt ids, seed and params) instead of starting afresh. Their KV
  // is recomputed (prefix-cache hits included); the RNG counter, penalty
  // window, held text and decoder bytes are recomputed from the ids and must
  // match, so an edited state is refused.
  std::vector<SampleState> resume;

  // Every check that needs no model beyond its vocabulary size: the table's
  // ranges (SamplingParams::validate too), the stop strings (count, bytes,
  // UTF-8) and the tenant's size. Throws InvalidArgument with field() set.
  // Cost: O(request size).
  void validate(int n_vocab) const;
};

struct SampleResult {
  std::vector<TokenId> ids;            // generated in this call (EOG excluded; the ids of a stop
                                       // string are kept, its text is not)
  std::vector<LogprobEntry> logprobs;  // [ids.size()] when logprobs >= 0
  std::string text;                    // text of these ids, stop string and after cut
  FinishReason finish = FinishReason::Length;
};

struct Usage {
  int64_t prompt_tokens = 0;     // prompt ids
  int64_t cached_tokens = 0;     // of those, not recomputed: prefix cache or state tiers
                                 // (first admission)
  int64_t restored_tokens = 0;   // of the cached ones, restored from the state tiers
  int64_t generated_tokens = 0;  // over all samples
};

// Where Response::seed came from: the request (or the session or resume
// state it continues), the OS entropy source, the engine's derivation
// secret (EngineOptions::seed_secret, seed.h), or the session it continues
// with a new turn (the session's seed + the turn's index).
enum class SeedSource { Given, Drawn, Derived, Session };
// "given", "drawn", "derived", "session".
const char* seed_source_name(SeedSource s);

struct Response {
  enum class Status { Ok, Cancelled, Failed };
  Status status = Status::Ok;
  std::string error;  // Failed: what went wrong (e.g. NaN logits from a broken model)

  uint64_t seed = 0;                // the seed used (drawn when the request had none)
  std::vector<TokenId> prompt_ids;  // as evaluated (template and BOS applied)
  std::string prompt_text;          // the text tokenized: the rendered chat, the prompt text
                                    // (or the text appended to a session); "" for ids
  // The chat template used: a family's name, "model" (the model's Jinja
  // template) or "file" (EngineOptions::chat_template_text); "" for a plain
  // prompt. For a Jinja template, chat_template_hash is the SHA-256 (hex) of
  // its source: with prompt_text it says exactly what produced the prompt.
  std::string chat_template;
  std::string chat_template_hash;
  // The request as the engine ran it: prompt_ids as evaluated (prompt,
  // messages and chat_template cleared), the seed set, a continued session's
  // saved request and sample states (resume) merged in. Submitting it (with
  // session and persist cleared) reproduces samples: what the audit log
  // records and `encore replay` and the consistency checks run.
  Request effective;
  std::vector<std::string> notes;     // remarks for the user (e.g. "a second BOS was not added")
  std::vector<SampleResult> samples;  // [n]
  std::vector<SampleState> states;    // [n] after this call: resume from here
  Usage usage;
  int32_t preemptions = 0;  // times the scheduler freed its KV to make room (recomputed)
  // Request::session named a usable saved session, which this request
  // continued (false: the session started afresh with this request's prompt).
  bool session_found = false;
  // Where `seed` came from (the audit log records it).
  SeedSource seed_source = SeedSource::Given;

  double queue_seconds = 0;     // submission to first forward step
  double prompt_seconds = 0;    // first step to the prompt's logits
  double ttft_seconds = 0;      // submission to the first sampled token
  double generate_seconds = 0;  // the prompt's logits to the end
};

// What a streaming request's handle delivers, in order: for each generated
// token a Token event (text may be empty while held back: partial UTF-8 or a
// possible stop string); per sample one Finish event (with the text held
// back until then); then one Done event. A cancelled or failed request ends
// with Done as well (Response::status says which).
struct Event {
  enum class Kind { Token, Finish, Done };
  Kind kind = Kind::Token;
  int sample = -1;                             // Token, Finish
  TokenId id = -1;                             // Token: the generated id
  std::string text;                            // Token, Finish: text that is now safe to show
  std::optional<LogprobEntry> logprob;         // Token, when logprobs >= 0
  FinishReason finish = FinishReason::Length;  // Finish
};

// XXH3-64 of the ids as little-endian int32, 16 hex digits: compares two
// outputs at a glance.
std::string output_hash(const std::vector<TokenId>& ids);

}  // namespace encore
