#include "server/openai_response.h"

namespace encore::server {
namespace {

Json usage_of(const Response& r) {
  Json u;
  u["prompt_tokens"] = r.usage.prompt_tokens;
  u["completion_tokens"] = r.usage.generated_tokens;
  u["total_tokens"] = r.usage.prompt_tokens + r.usage.generated_tokens;
  u["prompt_tokens_details"] = {{"cached_tokens", r.usage.cached_tokens}};
  return u;
}

Json bytes_of(const std::string& s) {
  Json b = Json::array();
  for (unsigned char ch : s) b.push_back(ch);
  return b;
}

// Chat's logprobs of some tokens: {"content": [{token, logprob, bytes, top_logprobs}]}.
Json chat_logprobs(const ReplyContext& c, const std::vector<LogprobEntry>& entries) {
  Json content = Json::array();
  for (const LogprobEntry& e : entries) {
    const std::string& tok = e.chosen.text;
    Json item = {{"token", tok}, {"logprob", e.chosen.logprob}, {"bytes", bytes_of(tok)}};
    Json top = Json::array();
    for (const TokenLogprob& t : e.top) {
      top.push_back({{"token", t.text}, {"logprob", t.logprob}, {"bytes", bytes_of(t.text)}});
    }
    item["top_logprobs"] = top;
    content.push_back(item);
  }
  return {{"content", content}};
}

// Completions' (legacy) logprobs: parallel lists, offsets into the text.
Json completion_logprobs(const ReplyContext& c, const std::vector<LogprobEntry>& entries,
                         size_t offset) {
  Json tokens = Json::array(), lps = Json::array(), tops = Json::array(), offs = Json::array();
  for (const LogprobEntry& e : entries) {
    const std::string& tok = e.chosen.text;
    tokens.push_back(tok);
    lps.push_back(e.chosen.logprob);
    Json top = Json::object();
    for (const TokenLogprob& t : e.top) top[t.text] = t.logprob;
    tops.push_back(top);
    offs.push_back(offset);
    offset += tok.size();
  }
  return {
      {"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offs}};
}

Json envelope(const ReplyContext& c, uint64_t seed, bool chunk) {
  Json j;
  j["id"] = c.id;
  j["object"] = c.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  j["created"] = c.created;
  j["model"] = c.model;
  j["system_fingerprint"] = c.system_fingerprint;
  j["seed"] = seed;
  if (!c.session.empty()) {
    j["session_id"] = c.session;
    j["session_continued"] = c.session_continued;
  }
  return j;
}

}  // namespace

const char* openai_finish_reason(FinishReason r) {
  return r == FinishReason::Eog || r == FinishReason::Stop ? "stop" : "length";
}

Json reply_json(const ReplyContext& c, const Response& r) {
  Json j = envelope(c, r.seed, false);
  Json choices = Json::array();
  for (size_t i = 0; i < r.samples.size(); ++i) {
    const SampleResult& s = r.samples[i];
    Json ch;
    ch["index"] = i;
    if (c.chat) {
      ch["message"] = {{"role", "assistant"}, {"content", s.text}};
      ch["logprobs"] = c.logprobs >= 0 ? chat_logprobs(c, s.logprobs) : Json(nullptr);
    } else {
      ch["text"] = s.text;
      ch["logprobs"] = c.logprobs >= 0 ? completion_logprobs(c, s.logprobs, 0) : Json(nullptr);
    }
    ch["finish_reason"] = openai_finish_reason(s.finish);
    ch["output_hash"] = output_hash(s.ids);
    choices.push_back(ch);
  }
  j["choices"] = choices;
  j["usage"] = usage_of(r);
  return j;
}

Json role_chunk(const ReplyContext& c, uint64_t seed, int choice) {
  Json j = envelope(c, seed, true);
  j["choices"] = Json::array({{{"index", choice},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}}});
  return j;
}

Json text_chunk(const ReplyContext& c, uint64_t seed, int choice, const std::string& text,
                const std::optional<LogprobEntry>& lp, size_t text_offset) {
  Json j = envelope(c, seed, true);
  Json ch;
  ch["index"] = choice;
  std::vector<LogprobEntry> one;
  if (lp && c.logprobs >= 0) one.push_back(*lp);
  if (c.chat) {
    ch["delta"] = {{"content", text}};
    ch["logprobs"] = one.empty() ? Json(nullptr) : chat_logprobs(c, one);
  } else {
    ch["text"] = text;
    ch["logprobs"] = one.empty() ? Json(nullptr) : completion_logprobs(c, one, text_offset);
  }
  ch["finish_reason"] = nullptr;
  j["choices"] = Json::array({ch});
  return j;
}

Json finish_chunk(const ReplyContext& c, uint64_t seed, int choice, std::string_view reason,
                  const std::string& hash) {
  Json j = envelope(c, seed, true);
  Json ch;
  ch["index"] = choice;
  if (c.chat) {
    ch["delta"] = Json::object();
  } else {
    ch["text"] = "";
  }
  ch["logprobs"] = nullptr;
  ch["finish_reason"] = reason;
  ch["output_hash"] = hash;
  j["choices"] = Json::array({ch});
  return j;
}

Json usage_chunk(const ReplyContext& c, const Response& r) {
  Json j = envelope(c, r.seed, true);
  j["choices"] = Json::array();
  j["usage"] = usage_of(r);
  return j;
}

Json error_json(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? Json(nullptr) : Json(param)},
            {"code", code.empty() ? Json(nullptr) : Json(code)}}}};
}

}  // namespace encore::server
