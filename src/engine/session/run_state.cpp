#include "encore/run_state.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "encore/error.h"
#include "util/json_read.h"

namespace encore {
namespace {

using Json = nlohmann::ordered_json;
constexpr size_t kMaxMessages = 4096;
constexpr const char* kFormat = "encore-run-state";
constexpr int kVersion = 1;
constexpr uintmax_t kMaxFileBytes = 256u << 20;  // far above any real state

std::string to_hex(const std::string& bytes) {
  std::string out;
  for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
  return out;
}

std::string from_hex(const std::string& hex) {
  if (hex.size() % 2 != 0) throw InvalidArgument("odd number of hex digits");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    const std::string byte = hex.substr(i, 2);
    if (byte.find_first_not_of("0123456789abcdef") != std::string::npos) {
      throw InvalidArgument(fmt::format("'{}' is not a lowercase hex byte", byte));
    }
    out += static_cast<char>(std::stoi(byte, nullptr, 16));
  }
  return out;
}

Json sampling_json(const SamplingParams& p) {
  Json j;
  j["temp"] = p.temp;
  j["top_k"] = p.top_k;
  j["top_p"] = p.top_p;
  j["min_p"] = p.min_p;
  j["typical_p"] = p.typical_p;
  j["repeat_penalty"] = p.repeat_penalty;
  j["repeat_last_n"] = p.repeat_last_n;
  j["presence_penalty"] = p.presence_penalty;
  j["frequency_penalty"] = p.frequency_penalty;
  Json bias = Json::array();
  for (const auto& [id, b] : p.logit_bias) {
    bias.push_back({id, b == -std::numeric_limits<float>::infinity() ? Json("-inf") : Json(b)});
  }
  j["logit_bias"] = bias;
  j["samplers"] = sampler_order_string(p.order);
  return j;
}

SamplingParams sampling_from(const Json& j, const std::string& where) {
  SamplingParams p;
  p.temp = util::json_get<float>(j, "temp", where);
  p.top_k = util::json_get<int32_t>(j, "top_k", where);
  p.top_p = util::json_get<float>(j, "top_p", where);
  p.min_p = util::json_get<float>(j, "min_p", where);
  p.typical_p = util::json_get<float>(j, "typical_p", where);
  p.repeat_penalty = util::json_get<float>(j, "repeat_penalty", where);
  p.repeat_last_n = util::json_get<int32_t>(j, "repeat_last_n", where);
  p.presence_penalty = util::json_get<float>(j, "presence_penalty", where);
  p.frequency_penalty = util::json_get<float>(j, "frequency_penalty", where);
  const Json bias = util::json_get<Json>(j, "logit_bias", where);
  if (!bias.is_array()) throw InvalidArgument(where + ": logit_bias must be an array");
  for (const Json& e : bias) {
    if (!e.is_array() || e.size() != 2) {
      throw InvalidArgument(where + ": logit_bias entries must be [id, bias]");
    }
    const auto id = util::json_convert<int32_t>(e[0], where + ": logit_bias id");
    float b = -std::numeric_limits<float>::infinity();
    if (!(e[1].is_string() && e[1] == "-inf"))
      b = util::json_convert<float>(e[1], where + ": logit_bias");
    p.logit_bias.emplace_back(id, b);
  }
  p.order = parse_sampler_order(util::json_get<std::string>(j, "samplers", where));
  return p;
}

}  // namespace

RunState run_state_after(const Request& request, const Response& response,
                         const std::string& system_fingerprint, int32_t n_ctx) {
  RunState s;
  s.system_fingerprint = system_fingerprint;
  s.n_ctx = n_ctx;
  s.request.prompt_ids = response.prompt_ids;
  s.request.seed = response.seed;
  s.request.sampling = request.sampling;
  s.request.n = request.n;
  s.request.logprobs = request.logprobs;
  s.request.stop = request.stop;
  s.request.ignore_eos = request.ignore_eos;
  s.request.resume = response.states;
  s.request.messages = request.messages;
  s.request.chat_template = request.chat_template;
  return s;
}

void save_run_state(const std::string& path, const RunState& s) {
  const std::string text = run_state_json(s);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw InvalidArgument(fmt::format("--save-state {}: cannot write {}", path, tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::remove(tmp.c_str());
    throw InvalidArgument(
        fmt::format("--save-state {}: cannot rename {} over it: {}", path, tmp, ec.message()));
  }
}

Json generation_json(const Request& r) {
  Json req;
  req["sampling"] = sampling_json(r.sampling);
  req["n"] = r.n;
  req["logprobs"] = r.logprobs;
  req["stop"] = r.stop;
  req["ignore_eos"] = r.ignore_eos;
  return req;
}

Json sample_states_json(const std::vector<SampleState>& states) {
  Json samples = Json::array();
  for (const SampleState& st : states) {
    Json o;
    o["ids"] = st.ids;
    o["t"] = st.sampler.t;
    o["recent"] = st.sampler.recent;
    o["held_text_hex"] = to_hex(st.held_text);
    o["held_shown"] = st.held_shown;
    o["decoder_pending_hex"] = to_hex(st.decoder_pending);
    o["decoder_strip_pending"] = st.decoder_strip_pending;
    o["finished"] = st.finished ? Json(finish_reason_name(*st.finished)) : Json(nullptr);
    samples.push_back(o);
  }
  return samples;
}

std::string run_state_json(const RunState& s) {
  const Request& r = s.request;
  Json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["system_fingerprint"] = s.system_fingerprint;
  j["prompt_ids"] = r.prompt_ids;
  j["n_ctx"] = s.n_ctx;
  j["seed"] = r.seed.value_or(0);
  Json req = generation_json(r);
  if (!r.messages.empty()) {  // a chat session's conversation so far
    Json msgs = Json::array();
    for (const ChatMessage& m : r.messages)
      msgs.push_back({{"role", m.role}, {"content", m.content}});
    req["messages"] = msgs;
    req["chat_template"] = r.chat_template;
  }
  j["request"] = req;
  j["samples"] = sample_states_json(r.resume);
  if (s.session_seed) j["session_seed"] = *s.session_seed;
  if (s.turns != 0) j["turns"] = s.turns;
  if (s.generation != 0) j["generation"] = s.generation;
  if (s.saved_ms != 0) j["saved_ms"] = s.saved_ms;
  return j.dump(1) + "\n";
}

RunState load_run_state(const std::string& path) {
  const std::string where = "--resume " + path;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) throw InvalidArgument(fmt::format("{}: cannot read the file: {}", where, ec.message()));
  if (size > kMaxFileBytes) {
    throw InvalidArgument(fmt::format("{}: {} bytes is too large for a run state (at most {})",
                                      where, size, kMaxFileBytes));
  }
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_run_state(ss.str(), where);
}

void parse_generation(const Json& req, const std::string& where, Request& r) {
  r.sampling = sampling_from(util::json_get<Json>(req, "sampling", where + ": request"),
                             where + ": request.sampling");
  r.n = util::json_get<int32_t>(req, "n", where + ": request");
  r.logprobs = util::json_get<int32_t>(req, "logprobs", where + ": request");
  r.stop = util::json_get<std::vector<std::string>>(req, "stop", where + ": request");
  // Written by later builds only; absent means false.
  if (req.contains("ignore_eos"))
    r.ignore_eos = util::json_get<bool>(req, "ignore_eos", where + ": request");
}

namespace {

// The "request" object: what a continuation reuses of the request.
void parse_saved_request(const Json& req, const std::string& where, Request& r) {
  parse_generation(req, where, r);
  if (req.contains("messages")) {
    const Json msgs = util::json_get<Json>(req, "messages", where + ": request");
    if (!msgs.is_array() || msgs.size() > kMaxMessages) {
      throw InvalidArgument(
          fmt::format("{}: request.messages must be an array of at most {}", where, kMaxMessages));
    }
    for (size_t i = 0; i < msgs.size(); ++i) {
      const std::string w = fmt::format("{}: request.messages[{}]", where, i);
      r.messages.push_back({util::json_get<std::string>(msgs[i], "role", w),
                            util::json_get<std::string>(msgs[i], "content", w)});
    }
    r.chat_template = util::json_get<std::string>(req, "chat_template", where + ": request");
  }
}

// One entry of "samples": a sample's state after `n_prompt` prompt ids.
SampleState parse_sample_state(const Json& o, const std::string& w, size_t n_prompt,
                               int32_t n_ctx) {
  SampleState st;
  st.ids = util::json_get<std::vector<TokenId>>(o, "ids", w);
  // A sample stops when its last token would not fit (finish "context"),
  // so it holds at most n_ctx - prompt + 1 ids.
  if (n_prompt + st.ids.size() > static_cast<size_t>(n_ctx) + 1) {
    throw InvalidArgument(
        fmt::format("{}: {} ids after a {}-token prompt exceed the context size n_ctx = {}", w,
                    st.ids.size(), n_prompt, n_ctx));
  }
  st.sampler.t = util::json_get<uint64_t>(o, "t", w);
  st.sampler.recent = util::json_get<std::vector<TokenId>>(o, "recent", w);
  try {
    st.held_text = from_hex(util::json_get<std::string>(o, "held_text_hex", w));
    st.decoder_pending = from_hex(util::json_get<std::string>(o, "decoder_pending_hex", w));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: {}", w, e.what()));
  }
  st.held_shown = util::json_get<size_t>(o, "held_shown", w);
  st.decoder_strip_pending = util::json_get<bool>(o, "decoder_strip_pending", w);
  if (!o.contains("finished")) throw InvalidArgument(w + ": missing field 'finished'");
  if (!o["finished"].is_null()) {
    try {
      st.finished = finish_reason_from_name(util::json_get<std::string>(o, "finished", w));
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(fmt::format("{}: {}", w, e.what()));
    }
    if (*st.finished == FinishReason::Length) {
      throw InvalidArgument(w +
                            ": finished = \"length\" is never saved (a sample that reached "
                            "-n can continue): use null");
    }
  }
  return st;
}

}  // namespace

RunState parse_run_state(std::string_view text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON: {}", where, e.what()));
  }
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat) {
    throw InvalidArgument(
        fmt::format("{}: not an encore run state (no \"format\": \"{}\")", where, kFormat));
  }
  if (util::json_get<int>(j, "version", where) != kVersion) {
    throw InvalidArgument(fmt::format("{}: version {} is not supported (this build reads {})",
                                      where, j["version"].dump(), kVersion));
  }
  RunState s;
  Request& r = s.request;
  s.system_fingerprint = util::json_get<std::string>(j, "system_fingerprint", where);
  r.prompt_ids = util::json_get<std::vector<TokenId>>(j, "prompt_ids", where);
  s.n_ctx = util::json_get<int32_t>(j, "n_ctx", where);
  if (s.n_ctx < 1 || s.n_ctx > kMaxContext) {
    throw InvalidArgument(
        fmt::format("{}: n_ctx {} must be in [1, {}]", where, s.n_ctx, kMaxContext));
  }
  if (r.prompt_ids.empty() || r.prompt_ids.size() > static_cast<size_t>(s.n_ctx)) {
    throw InvalidArgument(fmt::format("{}: the prompt has {} ids; it must have 1 to n_ctx = {}",
                                      where, r.prompt_ids.size(), s.n_ctx));
  }
  r.seed = util::json_get<uint64_t>(j, "seed", where);
  parse_saved_request(util::json_get<Json>(j, "request", where), where, r);
  const Json samples = util::json_get<Json>(j, "samples", where);
  if (r.n < 1 || r.n > kMaxSamples) {
    throw InvalidArgument(fmt::format("{}: n = {} must be in [1, {}]", where, r.n, kMaxSamples));
  }
  if (!samples.is_array() || samples.size() != static_cast<size_t>(r.n)) {
    throw InvalidArgument(
        fmt::format("{}: samples must be an array of n = {} entries", where, r.n));
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    const std::string w = fmt::format("{}: samples[{}]", where, i);
    r.resume.push_back(parse_sample_state(samples[i], w, r.prompt_ids.size(), s.n_ctx));
  }
  if (j.contains("session_seed"))
    s.session_seed = util::json_get<uint64_t>(j, "session_seed", where);
  if (j.contains("turns")) {
    s.turns = util::json_get<int64_t>(j, "turns", where);
    if (s.turns < 0) throw InvalidArgument(fmt::format("{}: turns {} is negative", where, s.turns));
  }
  if (j.contains("generation")) s.generation = util::json_get<uint64_t>(j, "generation", where);
  if (j.contains("saved_ms")) s.saved_ms = util::json_get<uint64_t>(j, "saved_ms", where);
  return s;
}

}  // namespace encore
