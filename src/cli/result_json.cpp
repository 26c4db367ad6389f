#include "cli/result_json.h"

namespace encore::cli {
namespace {

using Json = nlohmann::ordered_json;

Json logprobs_json(const std::vector<LogprobEntry>& entries, bool with_top) {
  auto one = [&](const TokenLogprob& t) {
    Json o;
    o["id"] = t.id;
    o["token"] = t.text;
    o["logprob"] = t.logprob;
    return o;
  };
  Json arr = Json::array();
  for (const LogprobEntry& e : entries) {
    Json o = one(e.chosen);
    if (with_top) {
      o["top_logprobs"] = Json::array();
      for (const TokenLogprob& t : e.top) o["top_logprobs"].push_back(one(t));
    }
    arr.push_back(o);
  }
  return arr;
}

}  // namespace

Json response_json(const Engine& engine, const Response& r, int n, bool with_top) {
  auto choice = [&](const SampleResult& s) {
    Json c;
    c["ids"] = s.ids;
    c["text"] = s.text;
    c["logprobs"] = logprobs_json(s.logprobs, with_top);
    c["finish_reason"] = finish_reason_name(s.finish);
    c["output_hash"] = output_hash(s.ids);
    return c;
  };
  Json j;
  j["prompt_ids"] = r.prompt_ids;
  if (n == 1 && r.samples.size() == 1) {
    j.update(choice(r.samples[0]));
  } else {
    j["choices"] = Json::array();
    for (size_t i = 0; i < r.samples.size(); ++i) {
      Json c;
      c["index"] = i;
      c.update(choice(r.samples[i]));
      j["choices"].push_back(c);
    }
  }
  const EngineInfo& info = engine.info();
  j["seed"] = r.seed;
  j["system_fingerprint"] = info.system_fingerprint;
  j["model_fingerprint"] = info.model_fingerprint;
  j["n_ctx"] = info.n_ctx;
  Json usage;
  usage["prompt_tokens"] = r.usage.prompt_tokens;
  usage["cached_tokens"] = r.usage.cached_tokens;
  usage["completion_tokens"] = r.usage.generated_tokens;
  j["usage"] = usage;
  if (!r.chat_template.empty()) j["chat_template"] = r.chat_template;
  if (!r.chat_template_hash.empty()) j["chat_template_hash"] = r.chat_template_hash;
  if (!r.chat_template.empty()) j["prompt_text"] = r.prompt_text;  // the rendered chat
  return j;
}

}  // namespace encore::cli
