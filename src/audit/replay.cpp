// audit::replay (include/encore/audit.h): every verified request line
// becomes the request the engine ran (Response::effective as logged) and
// runs again; its outputs are compared with the logged ones. The log is
// read once: lines are replayed as the chain check delivers them, `window`
// in flight, results reported in log order.
#include <fmt/format.h>

#include <deque>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "audit/item.h"
#include "audit/line.h"
#include "encore/error.h"
#include "encore/run_state.h"
#include "encore/version.h"
#include "util/json_read.h"

namespace encore::audit {
namespace {

using util::json_get;

// What --inputs gives for redacted lines: prompt ids by their SHA-256,
// output ids by theirs (so a line's id, which batch logs may repeat, never
// picks them).
struct Inputs {
  std::map<std::string, std::vector<TokenId>> prompts;
  std::map<std::string, std::vector<TokenId>> outputs;
};

Inputs read_inputs(const std::string& path) {
  Inputs in;
  if (path.empty()) return in;
  LineReader reader(path);
  LineReader::Got got;
  int64_t n = 0;
  while (reader.next(got)) {
    ++n;
    const std::string w = fmt::format("--inputs {}:{}", path, n);
    if (!got.complete) break;  // a torn last line (a log cut by a crash)
    if (got.too_long) throw InvalidArgument(w + ": the line is too long");
    if (got.text.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (!util::json_depth_within(got.text, kMaxJsonDepth)) {
      throw InvalidArgument(w + ": nested too deep");
    }
    Json j;
    try {
      j = Json::parse(got.text);
    } catch (const nlohmann::json::exception&) {
      throw InvalidArgument(w + ": not valid JSON");
    }
    if (!j.is_object() || !j.contains("request")) continue;  // another line type
    const Json& prompt =
        util::json_member(util::json_member(j, "request", w), "prompt", w + ": request");
    if (prompt.contains("ids")) {
      std::vector<TokenId> ids = json_get<std::vector<TokenId>>(prompt, "ids", w + ": request");
      in.prompts[ids_sha256(ids)] = std::move(ids);
    }
    if (j.contains("choices") && j["choices"].is_array()) {
      for (const Json& c : j["choices"]) {
        if (!c.is_object() || !c.contains("ids")) continue;
        std::vector<TokenId> ids = json_get<std::vector<TokenId>>(c, "ids", w + ": choices");
        in.outputs[ids_sha256(ids)] = std::move(ids);
      }
    }
  }
  return in;
}

std::string quoted(const std::function<std::string(TokenId)>& text, TokenId id) {
  if (!text || id < 0) return "";
  std::string t = Json(text(id)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return " " + t;
}

// Why the replayed sample `got` is not the logged one (`ids` when known), or "".
std::string compare_choice(size_t i, const LoggedChoice& lc, const SampleResult& got,
                           const std::function<std::string(TokenId)>& text) {
  const bool partial = !lc.finish.has_value();
  if (lc.ids) {
    const std::vector<TokenId>& want = *lc.ids;
    const size_t n = std::min(want.size(), got.ids.size());
    for (size_t p = 0; p < n; ++p) {
      if (want[p] != got.ids[p]) {
        return fmt::format("choice {}, token {}: logged {}{}, replayed {}{}", i, p, want[p],
                           quoted(text, want[p]), got.ids[p], quoted(text, got.ids[p]));
      }
    }
    if (got.ids.size() < want.size()) {
      return fmt::format("choice {}: the replay ended after {} tokens ({}), the log has {}", i,
                         got.ids.size(), finish_reason_name(got.finish), want.size());
    }
    if (!partial && got.ids.size() > want.size()) {
      return fmt::format("choice {}, token {}: the log ended ({}), the replay goes on with {}{}", i,
                         want.size(), *lc.finish, got.ids[want.size()],
                         quoted(text, got.ids[want.size()]));
    }
  } else {
    std::vector<TokenId> ids = got.ids;
    if (partial && ids.size() > static_cast<size_t>(lc.tokens)) ids.resize(lc.tokens);
    if (output_hash(ids) != lc.output_hash) {
      return fmt::format(
          "choice {}: output hash {} logged, {} replayed (the log is redacted: "
          "no token position; give the outputs with --inputs)",
          i, lc.output_hash, output_hash(ids));
    }
  }
  if (!partial && *lc.finish != finish_reason_name(got.finish)) {
    return fmt::format("choice {}: finish reason {} logged, {} replayed", i, *lc.finish,
                       finish_reason_name(got.finish));
  }
  return "";
}

struct Flight {
  Item item;
  std::optional<size_t> result;  // index into results
  RequestHandle handle;
};

class Replayer {
 public:
  Replayer(Engine& engine, const ReplayOptions& opt, const std::function<std::string(TokenId)>& t,
           ReplaySummary& sum)
      : engine_(engine), opt_(opt), text_(t), sum_(sum), inputs_(read_inputs(opt.inputs)) {
    in_range_ = opt.from_id.empty();
  }

  void line(const Line& l) {
    if (!l.json.contains("type") || l.json["type"] != "request") return;
    Item it;
    try {
      it = parse_request_line(l);
    } catch (const InvalidArgument& e) {
      add({"", "", "skipped", fmt::format("not a readable request line: {}", e.what()), l.seq});
      return;
    }
    if (!in_range_ && it.id == opt_.from_id) in_range_ = true;
    if (!in_range_ || past_end_) return;
    if (!opt_.to_id.empty() && it.id == opt_.to_id) past_end_ = true;
    if (opt_.tenant && it.tenant != *opt_.tenant) return;
    ++seen_;
    const std::string why = skip_reason(it);
    if (!why.empty()) {
      add({it.id, it.tenant, "skipped", why, it.seq});
      return;
    }
    if (it.state_hash) drain();  // it continues a turn that may be in flight
    Request q = it.req;
    if (it.state_hash) {
      // Any state a replayed turn of this session left (turns may overlap).
      const auto s = sessions_.find({it.tenant, it.session});
      const auto st =
          s == sessions_.end() ? decltype(s->second.end()){} : s->second.find(*it.state_hash);
      if (s == sessions_.end() || st == s->second.end()) {
        add({it.id, it.tenant, "skipped",
             fmt::format("it continues session {} from a state this replay did not re-derive "
                         "({})",
                         it.session,
                         s == sessions_.end() ? "its earlier turns are not among the replayed "
                                                "lines"
                                              : "an earlier turn differs or is missing"),
             it.seq});
        return;
      }
      q.resume = st->second;
    }
    if (!it.engine_ok) {
      // Cut short in the engine: replayed one token past the longest logged
      // output (so that a sample that had ended at its last logged token
      // ends the same way) and compared as far as logged.
      int64_t longest = 0;
      for (const LoggedChoice& c : it.choices) longest = std::max(longest, c.tokens);
      longest = std::min<int64_t>(longest + 1, std::numeric_limits<int32_t>::max());
      if (q.max_tokens < 0 || longest < q.max_tokens) q.max_tokens = static_cast<int32_t>(longest);
    }
    q.tenant = it.tenant;  // the prefix cache's salt: never changes the output
    q.logprobs = -1;
    q.stream = false;
    Flight f;
    f.item = std::move(it);
    try {
      f.handle = engine_.submit(std::move(q));
    } catch (const Error& e) {
      add({f.item.id, f.item.tenant, "skipped", fmt::format("this engine refused it: {}", e.what()),
           f.item.seq});
      return;
    }
    f.result = add({f.item.id, f.item.tenant, "", "", f.item.seq});
    flights_.push_back(std::move(f));
    while (flights_.size() > static_cast<size_t>(std::max(1, opt_.window))) finish_front();
  }

  void drain() {
    while (!flights_.empty()) finish_front();
  }
  // Throws InvalidArgument for a --from or --to id no request line has.
  void check_range() const {
    if (!opt_.from_id.empty() && !in_range_) {
      throw InvalidArgument(fmt::format("--from {}: no request line has this id", opt_.from_id));
    }
    if (!opt_.to_id.empty() && !past_end_) {
      throw InvalidArgument(
          fmt::format("--to {}: no request line from --from on has this id", opt_.to_id));
    }
  }

 private:
  size_t add(ReplayResult r) {
    sum_.results.push_back(std::move(r));
    progress();
    return sum_.results.size() - 1;
  }
  void progress() {
    if (opt_.progress)
      opt_.progress(static_cast<int64_t>(sum_.results.size() - flights_.size()), 0);
  }

  std::string skip_reason(Item& it) {
    const EngineInfo& info = engine_.info();
    if (!it.ran) return fmt::format("rejected when served: never ran ({})", it.error);
    if (it.status == "failed") return fmt::format("failed when served: {}", it.error);
    if (it.model_fp != info.model_fingerprint) {
      return fmt::format("model fingerprint differs: logged {}, this model {}", it.model_fp,
                         info.model_fingerprint);
    }
    if (it.engine_version != engine_version_string()) {
      return fmt::format("numerics version differs: logged engine {}, this one {}",
                         it.engine_version, engine_version_string());
    }
    if (it.kv_type != dtype_name(info.kv_type)) {
      return fmt::format(
          "KV type differs: logged {}, this engine {} (replay those lines with "
          "--kv-type)",
          it.kv_type, dtype_name(info.kv_type));
    }
    if (it.n_ctx != info.n_ctx) {
      return fmt::format("context size differs: logged {}, this engine {} (replay with -c {})",
                         it.n_ctx, info.n_ctx, it.n_ctx);
    }
    if (it.build_id != build_id_string() && sum_.engine_note.empty()) {
      sum_.engine_note = fmt::format(
          "the log was written by build {} and this is build {}: outputs are "
          "compared anyway (same engine version and model)",
          it.build_id, build_id_string());
    }
    if (it.resume_hash) return "it resumed sample states the log does not hold";
    if (it.req.prompt_ids.empty()) {
      const auto p = inputs_.prompts.find(it.prompt_hash);
      if (p == inputs_.prompts.end()) {
        return opt_.inputs.empty()
                   ? "redacted: the prompt is not in the log (give it with --inputs, docs/audit.md)"
                   : "redacted, and --inputs has no prompt with the logged hash";
      }
      it.req.prompt_ids = p->second;
      for (LoggedChoice& c : it.choices) {
        const auto o = inputs_.outputs.find(c.ids_hash);
        if (!c.ids && o != inputs_.outputs.end()) c.ids = o->second;
      }
    } else if (ids_sha256(it.req.prompt_ids) != it.prompt_hash) {
      return "the logged prompt ids do not match the logged prompt hash";
    }
    bool any = it.status == "completed";
    for (const LoggedChoice& c : it.choices) any = any || c.tokens > 0;
    if (!any) return fmt::format("{} before any token was generated", it.status);
    return "";
  }

  void finish_front() {
    Flight f = std::move(flights_.front());
    flights_.pop_front();
    ReplayResult& r = sum_.results[*f.result];
    const Response& got = f.handle.wait();
    if (got.status != Response::Status::Ok) {
      r.verdict = "differs";
      r.detail = fmt::format("the replay did not complete: {}",
                             got.error.empty() ? "cancelled" : got.error);
    } else if (got.samples.size() != f.item.choices.size()) {
      r.verdict = "differs";
      r.detail =
          fmt::format("{} choices logged, {} replayed", f.item.choices.size(), got.samples.size());
    } else {
      int64_t tokens = 0;
      for (size_t i = 0; i < got.samples.size() && r.detail.empty(); ++i) {
        r.detail = compare_choice(i, f.item.choices[i], got.samples[i], text_);
        tokens += f.item.choices[i].tokens;
      }
      r.verdict = r.detail.empty() ? "identical" : "differs";
      if (r.detail.empty()) {
        r.detail = fmt::format(
            "{} choice(s), {} tokens{}", got.samples.size(), tokens,
            f.item.status == "completed" ? "" : ", as far as logged (" + f.item.status + ")");
      }
    }
    // The engine saved the session only when it completed the request.
    if (!f.item.session.empty() && f.item.engine_ok && got.status == Response::Status::Ok) {
      sessions_[{f.item.tenant, f.item.session}][states_hash(got.states)] = got.states;
    }
    progress();
  }

  Engine& engine_;
  const ReplayOptions& opt_;
  const std::function<std::string(TokenId)>& text_;
  ReplaySummary& sum_;
  Inputs inputs_;
  std::deque<Flight> flights_;
  // (tenant, session) -> states by their hash: every state a replayed
  // turn left, for the turns that continue it.
  std::map<std::pair<std::string, std::string>, std::map<std::string, std::vector<SampleState>>>
      sessions_;
  bool in_range_ = false, past_end_ = false;
  int64_t seen_ = 0;
};

}  // namespace

ReplaySummary replay(Engine& engine, const ReplayOptions& options,
                     const std::function<std::string(TokenId)>& token_text) {
  ReplaySummary sum;
  Replayer r(engine, options, token_text, sum);
  sum.chain = verify(options.files, [&](const Line& l) { r.line(l); });
  r.drain();
  if (sum.chain.ok()) r.check_range();
  for (const ReplayResult& x : sum.results) {
    if (x.verdict == "identical") ++sum.identical;
    if (x.verdict == "differs") ++sum.differs;
    if (x.verdict == "skipped") ++sum.skipped;
  }
  return sum;
}

std::optional<LoggedNumerics> first_numerics(const std::vector<std::string>& files) {
  struct Found {
    LoggedNumerics n;
  };
  try {
    verify(files, [](const Line& l) {
      if (!l.json.contains("type") || l.json["type"] != "request") return;
      const std::string w = fmt::format("{}:{}", l.file, l.line_no);
      const Json& f = util::json_member(l.json, "fingerprint", w);
      throw Found{{json_get<int32_t>(f, "n_ctx", w + ": fingerprint"),
                   json_get<std::string>(f, "kv_type", w + ": fingerprint")}};
    });
  } catch (const Found& f) {
    return f.n;
  }
  return std::nullopt;
}

}  // namespace encore::audit
