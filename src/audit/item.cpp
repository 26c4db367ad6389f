#include "audit/item.h"

#include <fmt/format.h>

#include "encore/error.h"
#include "encore/run_state.h"
#include "util/json_read.h"

namespace encore::audit {

using util::json_get;
using util::json_member;

Item parse_request_line(const Line& line) {
  Item it;
  it.seq = line.seq;
  it.where = fmt::format("{}:{}", line.file, line.line_no);
  const Json& j = line.json;
  const std::string& w = it.where;
  it.id = json_get<std::string>(j, "id", w);
  it.tenant = json_get<std::string>(j, "tenant", w);
  it.status = json_get<std::string>(j, "status", w);
  if (j.contains("error")) it.error = json_get<std::string>(j, "error", w);
  // Whether the engine completed it (absent: as status says); a request
  // logged as cut short may have completed in the engine.
  it.engine_ok = j.contains("engine_status") ? json_get<std::string>(j, "engine_status", w) == "ok"
                                             : it.status == "completed";
  const Json& f = json_member(j, "fingerprint", w);
  it.model_fp = json_get<std::string>(f, "model", w + ": fingerprint");
  it.engine_version = json_get<std::string>(f, "engine_version", w + ": fingerprint");
  it.build_id = json_get<std::string>(f, "build_id", w + ": fingerprint");
  it.kv_type = json_get<std::string>(f, "kv_type", w + ": fingerprint");
  it.n_ctx = json_get<int32_t>(f, "n_ctx", w + ": fingerprint");
  if (!j.contains("request")) return it;
  it.ran = true;
  const Json& req = json_member(j, "request", w);
  const Json& prompt = json_member(req, "prompt", w + ": request");
  it.prompt_hash = json_get<std::string>(prompt, "hash", w + ": request.prompt");
  if (prompt.contains("ids")) {
    it.req.prompt_ids = json_get<std::vector<TokenId>>(prompt, "ids", w + ": request.prompt");
  }
  it.req.seed = json_get<uint64_t>(req, "seed", w + ": request");
  it.req.max_tokens = json_get<int32_t>(req, "max_tokens", w + ": request");
  parse_generation(json_member(req, "generation", w + ": request"), w, it.req);
  if (req.contains("session")) {
    const Json& s = json_member(req, "session", w + ": request");
    it.session = json_get<std::string>(s, "id", w + ": request.session");
    if (s.contains("state_hash") && !s["state_hash"].is_null()) {
      it.state_hash = json_get<std::string>(s, "state_hash", w + ": request.session");
    }
  }
  if (req.contains("resume_hash")) {
    it.resume_hash = json_get<std::string>(req, "resume_hash", w + ": request");
  }
  const Json& choices = json_member(j, "choices", w);
  if (!choices.is_array() || choices.size() > static_cast<size_t>(kMaxSamples)) {
    throw InvalidArgument(
        fmt::format("{}: choices must be an array of at most {}", w, kMaxSamples));
  }
  for (size_t i = 0; i < choices.size(); ++i) {
    const std::string cw = fmt::format("{}: choices[{}]", w, i);
    const Json& c = choices[i];
    LoggedChoice lc;
    if (c.contains("ids")) lc.ids = json_get<std::vector<TokenId>>(c, "ids", cw);
    if (c.contains("ids_hash")) lc.ids_hash = json_get<std::string>(c, "ids_hash", cw);
    lc.output_hash = json_get<std::string>(c, "output_hash", cw);
    if (c.contains("finish_reason") && !c["finish_reason"].is_null()) {
      lc.finish = json_get<std::string>(c, "finish_reason", cw);
    }
    lc.tokens = json_get<int64_t>(c, "tokens", cw);
    it.choices.push_back(std::move(lc));
  }
  return it;
}

}  // namespace encore::audit
