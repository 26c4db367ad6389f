// The settings table: every numeric request, engine and server setting
// declared once — its name, type, default, range, help and the front ends
// that expose it — and read by all of them: the CLI flags (src/cli), the
// OpenAI request parser (openai.h), Request::validate and
// SamplingParams::validate, EngineOptions::validate, Server::create, and the
// docs (docs/settings.md is printed by `encore settings`, and a test
// compares the two).
//
// The table is plain data. The structs that hold settings (SamplingParams,
// Request, ServerOptions, the CLI's EngineFlags) take their member defaults
// from it, and visit_settings() at the end of this file pairs every entry
// with its member — gemma.cpp's gemma_args.h pattern: a front end is a
// visitor `v(const Setting&, T& member)` called once per setting (bind a
// flag, read a JSON key, check a range). EngineOptions::validate checks its
// members (other units than the flags') against the entries by hand.
//
// One range per setting, the same in every front end. Where the OpenAI API
// documents a narrower range than llama.cpp accepts (temperature [0, 2],
// presence/frequency_penalty [-2, 2]), the range is the wider one that
// llama.cpp's CLI and llama-server (and vLLM, for temperature) accept:
// OpenAI's bounds are advice for its own models, and an engine that refuses
// what `llama-cli` runs would be a surprise. So no value that some front end
// took before is refused now. Integers span int32 where the engine has no
// tighter limit.
//
// Ownership: constants with static storage. Cost: none (constexpr).
// Thread-safety: read-only.
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace encore::settings {

enum class Type {
  Number,   // a float or double member: finite, in range
  Integer,  // an integer member (no fraction, no exponent)
  Seed,     // a uint64 (or -1: drawn at random)
  Bool,     // true or false (a CLI flag without a value); min 0, max 1
};

// Which front ends expose a setting (bits).
enum Front : unsigned {
  kApi = 1,     // the OpenAI request body (`encore serve`, `encore batch` lines)
  kRun = 2,     // `encore run` flags
  kChat = 4,    // `encore chat` flags
  kBatch = 8,   // `encore batch` flags
  kServe = 16,  // `encore serve` flags
  kBench = 32,  // `encore bench` flags
};

inline constexpr double kInt32Max = std::numeric_limits<int32_t>::max();
inline constexpr int64_t kNoOff = std::numeric_limits<int64_t>::min();

struct Setting {
  std::string_view name = {};   // the field as errors name it (Error::field()); request
                                // settings: the OpenAI JSON key
  std::string_view flags = {};  // the CLI names in CLI11's form ("-n,--n-predict"); "" none
  Type type = Type::Number;
  double def = 0;  // the default
  double min = 0, max = 0;
  bool min_open = false;            // (min, max] instead of [min, max]
  int64_t off = kNoOff;             // a value outside the range meaning "not set" (-1), or kNoOff
  std::string_view off_means = {};  // what off stands for ("none", "random")
  std::string_view help = {};       // one line for --help and the docs
  unsigned fronts = 0;              // Front bits

  constexpr float float_default() const { return static_cast<float>(def); }
  constexpr int32_t int_default() const { return static_cast<int32_t>(def); }
};

// ---- the request (Request, SamplingParams: request.h, sampler.h) -----------

inline constexpr unsigned kRequestFronts = kApi | kRun | kChat;

inline constexpr Setting kTemperature{
    .name = "temperature",
    .flags = "--temp",
    .def = 0.8,
    .min = 0,
    .max = 1e6,
    .help = "Temperature (0: greedy argmax, ties to the lowest id)",
    .fronts = kRequestFronts,
};
inline constexpr Setting kTopK{
    .name = "top_k",
    .flags = "--top-k",
    .type = Type::Integer,
    .def = 40,
    .min = 0,
    .max = kInt32Max,
    .help = "Keep the K most likely tokens (0: off)",
    .fronts = kRequestFronts,
};
inline constexpr Setting kTopP{
    .name = "top_p",
    .flags = "--top-p",
    .def = 0.95,
    .min = 0,
    .max = 1,
    .help = "Nucleus sampling (1: off)",
    .fronts = kRequestFronts,
};
inline constexpr Setting kMinP{
    .name = "min_p",
    .flags = "--min-p",
    .def = 0.05,
    .min = 0,
    .max = 1,
    .help = "Drop tokens below P x the top probability (0: off)",
    .fronts = kRequestFronts,
};
inline constexpr Setting kTypicalP{
    .name = "typical_p",
    .flags = "--typical",
    .def = 1,
    .min = 0,
    .max = 1,
    .help = "Locally typical sampling (1: off)",
    .fronts = kRequestFronts,
};
inline constexpr Setting kRepeatPenalty{
    .name = "repeat_penalty",
    .flags = "--repeat-penalty",
    .def = 1,
    .min = 0,
    .max = 1e6,
    .min_open = true,
    .help = "Repetition penalty (1: off)",
    .fronts = kRequestFronts,
};
inline constexpr Setting kRepeatLastN{
    .name = "repeat_last_n",
    .flags = "--repeat-last-n",
    .type = Type::Integer,
    .def = 64,
    .min = -1,
    .max = kInt32Max,
    .help = "Tokens the penalties look back over (0: off, -1: the context)",
    .fronts = kRequestFronts,
};
inline constexpr Setting kPresencePenalty{
    .name = "presence_penalty",
    .flags = "--presence-penalty",
    .def = 0,
    .min = -1e6,
    .max = 1e6,
    .help = "Presence penalty (0: off)",
    .fronts = kRequestFronts,
};
inline constexpr Setting kFrequencyPenalty{
    .name = "frequency_penalty",
    .flags = "--frequency-penalty",
    .def = 0,
    .min = -1e6,
    .max = 1e6,
    .help = "Frequency penalty (0: off)",
    .fronts = kRequestFronts,
};
inline constexpr Setting kMaxTokens{
    .name = "max_tokens",
    .flags = "-n,--n-predict",
    .type = Type::Integer,
    .def = -1,
    .min = -1,
    .max = kInt32Max,
    .help =
        "Tokens to generate per sample (-1: until EOG, a stop string or the context; "
        "/v1/completions defaults to 16; also max_completion_tokens)",
    .fronts = kRequestFronts,
};
inline constexpr Setting kN{
    .name = "n",
    .flags = "--n",
    .type = Type::Integer,
    .def = 1,
    .min = 1,
    .max = 64,
    .help = "Samples of the prompt; sample i is the same whatever n is",
    .fronts = kApi | kRun,
};
inline constexpr Setting kLogprobs{
    .name = "logprobs",
    .flags = "--logprobs",
    .type = Type::Integer,
    .def = -1,
    .min = 0,
    .max = 20,
    .off = -1,
    .off_means = "none",
    .help =
        "Log probabilities of the chosen token and of the N most likely ones at each "
        "position (chat: top_logprobs, with logprobs true; run: with --json)",
    .fronts = kApi | kRun,
};
inline constexpr Setting kSeed{
    .name = "seed",
    .flags = "--seed",
    .type = Type::Seed,
    .def = -1,
    .min = 0,
    .max = 18446744073709551615.0,
    .off = -1,
    .off_means = "random",
    .help = "Seed of the sampler (-1 or absent: drawn at random and reported)",
    .fronts = kRequestFronts,
};

inline constexpr Setting kIgnoreEos{
    .name = "ignore_eos",
    .flags = "--ignore-eos",
    .type = Type::Bool,
    .def = 0,
    .min = 0,
    .max = 1,
    .help = "Generate past end-of-generation tokens (benchmarks)",
    .fronts = kApi | kRun,
};
inline constexpr Setting kParseSpecial{
    .name = "parse_special",
    .flags = "--parse-special,--special",
    .type = Type::Bool,
    .def = 0,
    .min = 0,
    .max = 1,
    .help =
        "Tokenize special-token text in a text prompt (the BOS and EOS texts, chat markers) "
        "as those control tokens; without it such text is plain text. Not with messages "
        "(--chat): their content is always plain text (the API: /v1/completions only)",
    .fronts = kApi | kRun,
};

// A request setting that a server or a batch also sets for all its requests
// (ServerOptions::normalize_input; `encore batch --normalize-input`).
inline constexpr Setting kNormalizeInput{
    .name = "normalize_input",
    .flags = "--normalize-input",
    .type = Type::Bool,
    .def = 0,
    .min = 0,
    .max = 1,
    .help =
        "Trim leading and trailing whitespace and apply Unicode NFC to the prompt text, each "
        "message's content and text appended to a session before tokenizing (changes tokens; "
        "invalid UTF-8 is refused). serve, batch: for every request",
    .fronts = kApi | kRun | kBatch | kServe,
};

// ---- the engine (EngineOptions: engine.h; the CLI's EngineFlags) -------------

inline constexpr unsigned kEngineFronts = kRun | kChat | kBatch | kServe;

// The default 0 is no value a user gives: EngineOptions::threads' "not set".
inline constexpr Setting kThreads{
    .name = "threads",
    .flags = "-t,--threads",
    .type = Type::Integer,
    .def = 0,
    .min = 1,
    .max = 4096,  // ThreadPool::kMaxThreads
    .help = "Threads (default: every core)",
    .fronts = kEngineFronts | kBench,
};
inline constexpr Setting kCtxSize{
    .name = "n_ctx",
    .flags = "-c,--ctx-size",
    .type = Type::Integer,
    .def = 0,
    .min = 0,
    .max = 1 << 20,  // kMaxContext (request.h)
    .help = "Context size in tokens (0: the model's, at most 4096)",
    .fronts = kEngineFronts,
};
inline constexpr Setting kBatchTokens{
    .name = "batch_tokens",
    .flags = "-b,--batch-size,--batch-tokens",
    .type = Type::Integer,
    .def = 512,
    .min = 1,
    .max = 1 << 20,
    .help = "Tokens per forward step: prompts are evaluated in chunks of this many (speed only)",
    .fronts = kRun | kBatch | kServe,
};
inline constexpr Setting kKvMem{
    .name = "kv_mem_mib",
    .flags = "--kv-mem",
    .def = 0,
    .min = 0,
    .max = 1 << 24,
    .help = "KV cache budget in MiB (0: 80 % of the memory available)",
    .fronts = kEngineFronts | kBench,
};
inline constexpr Setting kStateTtl{
    .name = "state_ttl",
    .flags = "--state-ttl",
    .def = 0,
    .min = 0,
    .max = 1e9,
    .help = "Seconds the saved state lives (0: until the size cap removes it)",
    .fronts = kRun | kChat | kServe,
};
inline constexpr Setting kStateMaxMib{
    .name = "state_max_mib",
    .flags = "--state-max-mib",
    .def = 8192,
    .min = 1,
    .max = 1e9,
    .help = "Size cap of the state directory in MiB (the least recently used records go first)",
    .fronts = kRun | kChat | kServe,
};
inline constexpr Setting kTenantStateMib{
    .name = "tenant_state_mib",
    .flags = "--tenant-state-mib",
    .def = 0,
    .min = 0,
    .max = 1e9,
    .help =
        "Each tenant's share of the state directory and of Redis in MiB: its own least "
        "recently used sessions and snapshots make room for its writes, never another "
        "tenant's (0: no share; an --api-keys line's state_mib=N sets one tenant's)",
    .fronts = kServe,
};

// ---- the server (ServerOptions: server.h) ------------------------------------

inline constexpr Setting kPort{
    .name = "port",
    .flags = "--port",
    .type = Type::Integer,
    .def = 8080,
    .min = 0,
    .max = 65535,
    .help = "Port (0: any free one)",
    .fronts = kServe,
};
inline constexpr Setting kMaxInFlight{
    .name = "max_in_flight",
    .flags = "--max-queue",
    .type = Type::Integer,
    .def = 64,
    .min = 1,
    .max = 100000,
    .help = "Requests answered at once; more get 503",
    .fronts = kServe,
};
inline constexpr Setting kTenantInFlight{
    .name = "tenant_in_flight",
    .flags = "--tenant-limit",
    .type = Type::Integer,
    .def = 0,
    .min = 0,
    .max = 100000,
    .help = "Requests in flight per tenant; more get 429 (0: --max-queue)",
    .fronts = kServe,
};
inline constexpr Setting kMaxConnections{
    .name = "max_connections",
    .flags = "--max-connections",
    .type = Type::Integer,
    .def = 1024,
    .min = 1,
    .max = 1000000,
    .help = "Open client connections; more are shed at accept with 503",
    .fronts = kServe,
};
inline constexpr Setting kMaxConnectionsPerIp{
    .name = "max_connections_per_ip",
    .flags = "--max-connections-per-ip",
    .type = Type::Integer,
    .def = 64,
    .min = 0,
    .max = 1000000,
    .help = "Open connections per client address (0: no limit, e.g. behind a proxy)",
    .fronts = kServe,
};
inline constexpr Setting kMaxHeaderBytes{
    .name = "max_header_bytes",
    .flags = "--max-header-bytes",
    .type = Type::Integer,
    .def = 32 << 10,
    .min = 1024,
    .max = 1 << 20,
    .help = "Largest request line and headers in bytes (431 above; at most 100 fields)",
    .fronts = kServe,
};
inline constexpr Setting kMaxBodyBytes{
    .name = "max_body_bytes",
    .flags = "--max-body",
    .type = Type::Integer,
    .def = 8 << 20,
    .min = 1024,
    .max = 1 << 30,
    .help = "Largest request body in bytes, whatever the framing (413 above)",
    .fronts = kServe,
};
inline constexpr Setting kIoThreads{
    .name = "io_threads",
    .flags = "--io-threads",
    .type = Type::Integer,
    .def = 2,
    .min = 1,
    .max = 64,
    .help = "Threads that read and write every connection",
    .fronts = kServe,
};
inline constexpr Setting kRequestTimeout{
    .name = "request_timeout",
    .flags = "--request-timeout",
    .type = Type::Integer,
    .def = 600,
    .min = 1,
    .max = 86400,
    .help =
        "Seconds a request may take from submission to its last byte (504; at shutdown, "
        "--shutdown-grace bounds it)",
    .fronts = kServe,
};
inline constexpr Setting kReadTimeout{
    .name = "read_timeout",
    .flags = "--read-timeout",
    .type = Type::Integer,
    .def = 10,
    .min = 1,
    .max = 3600,
    .help = "Seconds a request may stall between two reads (stalled clients are cut off)",
    .fronts = kServe,
};
inline constexpr Setting kReadDeadline{
    .name = "read_deadline",
    .flags = "--read-deadline",
    .def = 30,
    .min = 0.1,
    .max = 3600,
    .help = "Seconds a client may take to send a whole request, however it trickles",
    .fronts = kServe,
};
inline constexpr Setting kIdleTimeout{
    .name = "idle_timeout",
    .flags = "--idle-timeout",
    .type = Type::Integer,
    .def = 5,
    .min = 1,
    .max = 3600,
    .help = "Seconds a kept-alive connection may wait for its next request",
    .fronts = kServe,
};
inline constexpr Setting kShutdownGrace{
    .name = "shutdown_grace",
    .flags = "--shutdown-grace",
    .type = Type::Integer,
    .def = 30,
    .min = 0,
    .max = 86400,
    .help =
        "Seconds a SIGTERM waits for the requests in flight before cancelling them (a "
        "second signal: exit at once)",
    .fronts = kServe,
};

inline constexpr Setting kShutdownDelay{
    .name = "shutdown_delay",
    .flags = "--shutdown-delay",
    .type = Type::Integer,
    .def = 0,
    .min = 0,
    .max = 3600,
    .help =
        "Seconds after SIGTERM that the port stays open, answering new requests 503 and /health "
        "\"draining\", so a load balancer takes the server out of rotation before it closes "
        "(requests in flight finish meanwhile)",
    .fronts = kServe,
};
inline constexpr Setting kAsyncSessionWrites{
    .name = "async_session_writes",
    .flags = "--async-session-writes",
    .type = Type::Bool,
    .def = 0,
    .min = 0,
    .max = 1,
    .help =
        "Answer a session's turn before its record is written to the state tiers (less latency; "
        "a server that dies before the write, milliseconds idle, seconds under load, loses the "
        "turn and another replica starts the session afresh)",
    .fronts = kServe,
};

// ---- the audit log and consistency checks (audit.h, server.h) ----------------

inline constexpr Setting kAuditMaxMib{
    .name = "audit_max_mib",
    .flags = "--audit-max-mib",
    .type = Type::Integer,
    .def = 256,
    .min = 0,
    .max = 1048576,
    .help = "Rotate the audit log to FILE.N before a line would take it past this size (0: never)",
    .fronts = kBatch | kServe,
};
inline constexpr Setting kAuditRedact{
    .name = "audit_redact",
    .flags = "--audit-redact",
    .type = Type::Bool,
    .def = 0,
    .min = 0,
    .max = 1,
    .help = "Hashes instead of the prompt's and the outputs' ids and text in the audit log",
    .fronts = kBatch | kServe,
};
inline constexpr Setting kShadowRate{
    .name = "shadow_rate",
    .flags = "--shadow-rate",
    .def = 0,
    .min = 0,
    .max = 1,
    .help =
        "Fraction of completed requests run again at the lowest priority and compared "
        "(consistency checks in /metrics and the audit log)",
    .fronts = kServe,
};

// Every setting above, in this order (the docs' order).
std::span<const Setting* const> all();

// ---- checks and text shared by every front end (src/settings) ----------------

// v is allowed: in range (finite; an integer for Integer settings) or off.
bool allowed(const Setting& s, double v);
// Throws InvalidArgument(s.name, "must be ..., got V") unless allowed(s, v).
void check(const Setting& s, double v);
// One Markdown table of every setting (docs/settings.md holds it verbatim).
std::string markdown_table();
// "[0, 1000000]", "(0, 1000000]", "[0, 20] or -1 (none)"; integers print whole.
std::string range_text(const Setting& s);
// "a number in [0, 1000000]", "an integer in [1, 64]" ...
std::string expected_text(const Setting& s);
// A setting value as the docs and --help show it (0.8, 40, 8388608).
std::string value_text(double v);
// The long flag ("--n-predict" of "-n,--n-predict"); "" when none.
std::string_view long_flag(const Setting& s);

}  // namespace encore::settings

// ---- the bindings: which member of which struct holds each setting --------------
//
// visit_settings(object, v) calls v(const Setting&, member&) once per setting
// the object holds, in the table's order (const objects give const
// members). Members are arithmetic, but for durations (given in seconds) and
// the seed (std::optional<uint64_t>; -1 means absent). Templates, so this
// header needs only the declarations below.

namespace encore {

struct SamplingParams;  // sampler.h
struct Request;         // request.h
struct ServerOptions;   // server.h
namespace cli {
struct EngineFlags;  // src/cli/engine_flags.h: the engine flags of the CLI commands
struct AuditFlags;   // src/cli/engine_flags.h: --audit-log and its options
}  // namespace cli

template <class P, class V>
requires std::same_as<std::remove_const_t<P>, SamplingParams>
void visit_settings(P& p, V&& v) {
  v(settings::kTemperature, p.temp);
  v(settings::kTopK, p.top_k);
  v(settings::kTopP, p.top_p);
  v(settings::kMinP, p.min_p);
  v(settings::kTypicalP, p.typical_p);
  v(settings::kRepeatPenalty, p.repeat_penalty);
  v(settings::kRepeatLastN, p.repeat_last_n);
  v(settings::kPresencePenalty, p.presence_penalty);
  v(settings::kFrequencyPenalty, p.frequency_penalty);
}

// Its SamplingParams' first.
template <class R, class V>
requires std::same_as<std::remove_const_t<R>, Request>
void visit_settings(R& r, V&& v) {
  visit_settings(r.sampling, v);
  v(settings::kMaxTokens, r.max_tokens);
  v(settings::kN, r.n);
  v(settings::kLogprobs, r.logprobs);
  v(settings::kSeed, r.seed);
  v(settings::kIgnoreEos, r.ignore_eos);
  v(settings::kParseSpecial, r.parse_special);
  v(settings::kNormalizeInput, r.normalize_input);
}

template <class F, class V>
requires std::same_as<std::remove_const_t<F>, cli::EngineFlags>
void visit_settings(F& f, V&& v) {
  v(settings::kThreads, f.threads);
  v(settings::kKvMem, f.kv_mem_mib);
  v(settings::kCtxSize, f.ctx_size);
  v(settings::kBatchTokens, f.batch_tokens);
  v(settings::kStateTtl, f.state_ttl_s);
  v(settings::kStateMaxMib, f.state_max_mib);
  v(settings::kTenantStateMib, f.tenant_state_mib);
  v(settings::kAsyncSessionWrites, f.async_session_writes);
}

template <class O, class V>
requires std::same_as<std::remove_const_t<O>, ServerOptions>
void visit_settings(O& o, V&& v) {
  v(settings::kPort, o.port);
  v(settings::kMaxInFlight, o.max_in_flight);
  v(settings::kTenantInFlight, o.tenant_in_flight);
  v(settings::kReadTimeout, o.read_timeout);
  v(settings::kReadDeadline, o.read_deadline);
  v(settings::kIdleTimeout, o.idle_timeout);
  v(settings::kMaxConnections, o.max_connections);
  v(settings::kMaxConnectionsPerIp, o.max_connections_per_ip);
  v(settings::kMaxHeaderBytes, o.max_header_bytes);
  v(settings::kIoThreads, o.io_threads);
  v(settings::kMaxBodyBytes, o.max_body_bytes);
  v(settings::kRequestTimeout, o.request_timeout);
  v(settings::kShadowRate, o.shadow_rate);
  v(settings::kNormalizeInput, o.normalize_input);
}

template <class F, class V>
requires std::same_as<std::remove_const_t<F>, cli::AuditFlags>
void visit_settings(F& f, V&& v) {
  v(settings::kAuditMaxMib, f.max_mib);
  v(settings::kAuditRedact, f.redact);
}

}  // namespace encore
