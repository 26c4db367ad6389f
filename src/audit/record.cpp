// The audit log's records (include/encore/audit.h): what a "request" line
// holds, built from the engine's Response, and the digests it uses.
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <openssl/evp.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "audit/line.h"
#include "encore/audit.h"
#include "encore/error.h"
#include "encore/run_state.h"
#include "encore/version.h"
#include "util/little_endian.h"

namespace encore::audit {

const char* fsync_name(Fsync f) {
  switch (f) {
    case Fsync::Always:
      return "always";
    case Fsync::Interval:
      return "interval";
    case Fsync::Never:
      return "never";
  }
  return "?";
}

Fsync fsync_from_name(std::string_view name) {
  for (Fsync f : {Fsync::Always, Fsync::Interval, Fsync::Never}) {
    if (name == fsync_name(f)) return f;
  }
  throw InvalidArgument("audit_fsync",
                        fmt::format("'{}' is not one of always, interval, never", name));
}

std::string ids_sha256(const std::vector<TokenId>& ids) {
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (const TokenId id : ids) {
    const auto u = static_cast<uint32_t>(id);
    for (int b = 0; b < 4; ++b) bytes += static_cast<char>((u >> (8 * b)) & 0xff);
  }
  return sha256_hex(bytes);
}

std::string states_hash(const std::vector<SampleState>& states) {
  return sha256_hex(sample_states_json(states).dump());
}

namespace {

Json fingerprint_json(const EngineInfo& info) {
  Json f;
  f["system"] = info.system_fingerprint;
  f["model"] = info.model_fingerprint;
  f["engine_version"] = engine_version_string();
  f["build_id"] = build_id_string();
  f["kv_type"] = dtype_name(info.kv_type);
  f["n_ctx"] = info.n_ctx;
  return f;
}

}  // namespace

Json request_record(std::string_view id, std::string_view endpoint, std::string_view tenant,
                    const Ending& ending, const Response* response, const EngineInfo& info,
                    bool redact) {
  Json j;
  j["type"] = "request";
  j["time"] = utc_now();
  j["id"] = id;
  j["endpoint"] = endpoint;
  j["tenant"] = tenant;
  j["status"] = ending.status;
  if (!ending.error.empty()) j["error"] = ending.error;
  if (ending.http_status != 0) j["http_status"] = ending.http_status;
  j["fingerprint"] = fingerprint_json(info);
  if (response == nullptr) return j;
  const Response& r = *response;
  const Request& e = r.effective;
  j["engine_status"] = r.status == Response::Status::Ok          ? "ok"
                       : r.status == Response::Status::Cancelled ? "cancelled"
                                                                 : "failed";

  // A record that would pass kMaxLineBytes (n samples of long outputs)
  // keeps hashes instead of ids and text, and says so.
  uint64_t estimate = 16 * r.prompt_ids.size() + 6 * r.prompt_text.size() + 4096;
  for (const SampleResult& s : r.samples) estimate += 16 * s.ids.size() + 6 * s.text.size() + 256;
  if (!redact && estimate > kMaxLineBytes / 2) {
    redact = true;
    j["oversized_redacted"] = true;
  }
  Json req;
  Json prompt;
  prompt["tokens"] = r.prompt_ids.size();
  prompt["hash"] = ids_sha256(r.prompt_ids);
  if (redact) {
    prompt["text_hash"] = sha256_hex(r.prompt_text);
  } else {
    prompt["ids"] = r.prompt_ids;
    prompt["text"] = r.prompt_text;
  }
  req["prompt"] = std::move(prompt);
  req["chat_template"] = r.chat_template;
  if (!r.chat_template_hash.empty()) req["chat_template_hash"] = r.chat_template_hash;
  req["normalize_input"] = e.normalize_input;
  req["seed"] = r.seed;
  req["seed_source"] = seed_source_name(r.seed_source);
  req["max_tokens"] = e.max_tokens;
  req["generation"] = generation_json(e);
  if (!e.session.empty()) {
    Json s;
    s["id"] = e.session;
    s["continued"] = r.session_found;
    // A continuation without a prompt resumes the saved samples: the replay
    // must resume the same ones (their hash); one with a prompt starts
    // fresh samples after the saved ids, which prompt.ids holds.
    s["state_hash"] = e.resume.empty() ? Json(nullptr) : Json(states_hash(e.resume));
    req["session"] = std::move(s);
  } else if (!e.resume.empty()) {
    req["resume_hash"] = states_hash(e.resume);
  }
  j["request"] = std::move(req);

  Json choices = Json::array();
  for (size_t i = 0; i < r.samples.size(); ++i) {
    const SampleResult& s = r.samples[i];
    // This call's ids (a continuation's state holds those of every call;
    // the output hash the client got is of these). A request cut short
    // (cancelled, stopped, failed) has a reason only for the samples that
    // had ended: the others' ids are a prefix of what they would have been.
    Json c;
    c["index"] = i;
    std::optional<FinishReason> why;
    if (r.status == Response::Status::Ok) {
      why = s.finish;
    } else if (i < r.states.size()) {
      why = r.states[i].finished;
    }
    c["finish_reason"] = why ? Json(finish_reason_name(*why)) : Json(nullptr);
    c["tokens"] = s.ids.size();
    c["output_hash"] = output_hash(s.ids);
    if (redact) {
      c["ids_hash"] = ids_sha256(s.ids);
      c["text_hash"] = sha256_hex(s.text);
    } else {
      c["ids"] = s.ids;
      c["text"] = s.text;
    }
    choices.push_back(std::move(c));
  }
  j["choices"] = std::move(choices);
  Json u;
  u["prompt_tokens"] = r.usage.prompt_tokens;
  u["cached_tokens"] = r.usage.cached_tokens;
  u["restored_tokens"] = r.usage.restored_tokens;
  u["generated_tokens"] = r.usage.generated_tokens;
  j["usage"] = std::move(u);
  j["preemptions"] = r.preemptions;
  return j;
}

}  // namespace encore::audit
