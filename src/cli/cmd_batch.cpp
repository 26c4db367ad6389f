// `encore batch`: the offline front end. One OpenAI-shaped request per JSONL
// line in, one result per line out, in input order; every request runs
// through one engine concurrently (continuous batching, prefix cache).
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/result_json.h"
#include "cli/setting_flags.h"
#include "encore/audit.h"
#include "encore/engine.h"
#include "encore/error.h"
#include "encore/openai.h"
#include "util/line_reader.h"

namespace encore::cli {
namespace {

using Json = nlohmann::ordered_json;
using BatchClock = std::chrono::steady_clock;

struct BatchArgs {
  std::string model;
  std::string input = "-";
  std::string output = "-";
  EngineFlags engine;
  AuditFlags audit;
  int32_t max_in_flight = 1024;
  std::string chat_template;  // for chat lines of a model without (or with another) template
  bool progress_on = false;   // --progress: draw the bar even when stderr is no terminal
  bool progress_off = false;  // --no-progress
  bool normalize_input = settings::kNormalizeInput.def != 0;  // for every line, whatever it says
};

// Lines of the input, each at most api::kMaxLineBytes: a longer line is
// skipped (not held in memory) and reported as too long.
struct LineReader : util::LineReader {
  explicit LineReader(std::istream& in) : util::LineReader(in, api::kMaxLineBytes) {}
};

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r") == std::string::npos; }

// Non-blank lines of a regular file (the progress bar's total); 0 if unknown.
size_t count_requests(const std::string& path) {
  std::error_code ec;
  if (path == "-" || !std::filesystem::is_regular_file(path, ec)) return 0;
  std::ifstream in(path, std::ios::binary);
  LineReader reader(in);
  LineReader::Line line;
  size_t n = 0;
  while (reader.next(line)) n += (line.too_long || !blank(line.text)) ? 1 : 0;
  return n;
}

// The request field an error is about, in the OpenAI names of the input;
// null if none.
Json field_of(const Error& e) {
  const std::string f = api::param_of(e);
  return f.empty() ? Json(nullptr) : Json(f);
}

Json error_result(const std::optional<std::string>& custom_id, size_t line,
                  const std::string& message, Json field) {
  Json j;
  j["custom_id"] = custom_id ? Json(*custom_id) : Json(nullptr);
  Json e;
  e["message"] = message;
  e["line"] = line;
  e["field"] = std::move(field);
  j["error"] = std::move(e);
  return j;
}

struct Pending {
  size_t line = 0;
  std::optional<std::string> custom_id;
  int32_t n = 1;
  int32_t logprobs = -1;
  RequestHandle handle;
  std::optional<Json> error;  // refused before it ran
};

struct Totals {
  size_t done = 0, ok = 0, errors = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, generated = 0, preemptions = 0;
};

// The results file: written to OUT.tmp and renamed over OUT once whole, so
// a run that fails leaves no half-written results behind; or stdout.
class ResultsOut {
 public:
  explicit ResultsOut(const std::string& path)
      : path_(path), tmp_(path + ".tmp"), to_stdout_(path == "-") {
    if (to_stdout_) return;
    file_.open(tmp_, std::ios::binary | std::ios::trunc);
    if (!file_) throw InvalidArgument(fmt::format("-o {}: cannot write {}", path_, tmp_));
  }
  std::ostream& stream() { return to_stdout_ ? std::cout : file_; }
  void commit() {
    std::ostream& out = stream();
    out.flush();
    if (!out) throw InvalidArgument(fmt::format("-o {}: writing the results failed", path_));
    if (to_stdout_) return;
    file_.close();
    std::error_code ec;
    std::filesystem::rename(tmp_, path_, ec);
    if (ec) {
      throw InvalidArgument(
          fmt::format("-o {}: cannot rename {} over it: {}", path_, tmp_, ec.message()));
    }
  }

 private:
  const std::string path_, tmp_;
  const bool to_stdout_;
  std::ofstream file_;
};

// One input line submitted (or refused: its error result kept).
Pending submit_line(Engine& engine, const LineReader::Line& line, size_t line_no,
                    const BatchArgs& a) {
  Pending p;
  p.line = line_no;
  if (line.too_long) {
    p.error =
        error_result(std::nullopt, line_no,
                     fmt::format("the line is longer than {} bytes", api::kMaxLineBytes), nullptr);
    return p;
  }
  p.custom_id = api::peek_custom_id(line.text);
  try {
    api::BatchLine b = api::parse_batch_line(line.text);
    p.custom_id = b.custom_id;
    Request& r = b.request;
    r.stream = false;
    if (!r.messages.empty() && r.chat_template.empty()) r.chat_template = a.chat_template;
    if (a.normalize_input) r.normalize_input = true;
    p.n = r.n;
    p.logprobs = r.logprobs;
    p.handle = engine.submit(std::move(r));
  } catch (const Error& e) {  // from the parser or the engine
    p.error = error_result(p.custom_id, line_no, e.what(), field_of(e));
  }
  return p;
}

// The result line of a request that ran (counted in `t`).
Json result_of(const Engine& engine, Pending& p, Totals& t) {
  const Response& r = p.handle.wait();
  if (r.status != Response::Status::Ok) {
    ++t.errors;
    return error_result(p.custom_id, p.line, r.error.empty() ? "cancelled" : r.error, nullptr);
  }
  Json j;
  if (p.custom_id) j["custom_id"] = *p.custom_id;
  j.update(response_json(engine, r, p.n, p.logprobs > 0));
  if (p.logprobs < 0) {  // not asked: no logprobs lists
    if (j.contains("choices")) {
      for (Json& c : j["choices"]) c.erase("logprobs");
    } else {
      j.erase("logprobs");
    }
  }
  ++t.ok;
  t.prompt_tokens += r.usage.prompt_tokens;
  t.cached_tokens += r.usage.cached_tokens;
  t.generated += r.usage.generated_tokens;
  t.preemptions += r.preemptions;
  return j;
}

// A request's audit line: `refused` is its error result when it never ran.
audit::Json audit_line(const Engine& engine, Pending& p, const Json* refused, bool redact) {
  const std::string id = p.custom_id ? *p.custom_id : fmt::format("line-{}", p.line);
  if (refused != nullptr) {
    const std::string why = (*refused)["error"]["message"].get<std::string>();
    return audit::request_record(id, "batch", "", {"rejected", why, 0}, nullptr, engine.info(),
                                 redact);
  }
  const Response& r = p.handle.wait();
  audit::Ending ending{"completed", "", 0};
  if (r.status == Response::Status::Failed) ending = {"failed", r.error, 0};
  if (r.status == Response::Status::Cancelled) ending = {"cancelled", "cancelled", 0};
  return audit::request_record(id, "batch", "", ending, &r, engine.info(), redact);
}

void print_summary(const Totals& t, const EngineStats& s, double secs) {
  fmt::print(stderr, "batch: {} requests ({} ok, {} errors) in {:.2f} s\n", t.done, t.ok, t.errors,
             secs);
  fmt::print(stderr,
             "tokens: {} prompt ({} from the prefix cache, {:.1f} %), {} generated ({:.1f} "
             "tok/s)\n",
             t.prompt_tokens, t.cached_tokens,
             t.prompt_tokens > 0 ? 100.0 * t.cached_tokens / t.prompt_tokens : 0.0, t.generated,
             secs > 0 ? t.generated / secs : 0.0);
  fmt::print(stderr,
             "prefix cache: {} lookups, {} hit blocks ({} tokens), {} evictions; preemptions: "
             "{}; forward steps: {}\n",
             s.prefix_lookups, s.prefix_hit_blocks, s.prefix_hit_tokens, s.prefix_evictions,
             s.preemptions, s.steps);
}

void run_batch(const BatchArgs& a) {
  std::ifstream file_in;
  if (a.input != "-") {
    file_in.open(a.input, std::ios::binary);
    if (!file_in) throw InvalidArgument(fmt::format("-i {}: cannot open the file", a.input));
  }
  std::istream& in = a.input == "-" ? std::cin : file_in;
  ResultsOut results(a.output);
  std::ostream& out = results.stream();
  std::unique_ptr<audit::AuditLog> audit_log;
  if (!a.audit.path.empty()) {
    audit_log = audit::AuditLog::open(audit_options(a.audit), [](std::string_view line) {
      fmt::print(stderr, "batch: {}\n", line);
    });
  }

  const std::unique_ptr<Engine> engine = Engine::open(engine_options(a.model, a.engine, false));
  const EngineInfo& info = engine->info();
  if (info.synthetic) {
    fmt::print(stderr, "note: {} has random weights (made by `encore synth`)\n", a.model);
  }
  fmt::print(stderr,
             "load: {:.1f} ms ({} threads, {} kernels, context {}, KV {} blocks, prefix "
             "cache {})\n",
             info.load_seconds * 1e3, info.threads, isa_name(info.isa), info.n_ctx, info.kv_blocks,
             info.prefix_cache ? "on" : "off");

  const size_t total = count_requests(a.input);
  const bool progress = !a.progress_off && (a.progress_on || isatty(STDERR_FILENO) != 0);
  const auto start = BatchClock::now();
  auto last_draw = start;
  Totals t;
  auto draw = [&](bool force) {
    const auto now = BatchClock::now();
    if (!progress || (!force && now - last_draw < std::chrono::milliseconds(100))) return;
    last_draw = now;
    const double secs = std::chrono::duration<double>(now - start).count();
    const EngineStats s = engine->stats();
    fmt::print(stderr, "\r[{}/{}] {:.1f} tok/s, prefix cache {:.0f} % of prompt tokens   ", t.done,
               total > 0 ? fmt::format("{}", total) : std::string("?"),
               secs > 0 ? s.tokens_generated / secs : 0.0,
               t.prompt_tokens > 0 ? 100.0 * t.cached_tokens / t.prompt_tokens : 0.0);
  };

  // Results are written in input order: the window holds the requests in
  // flight, the oldest first.
  std::deque<Pending> window;
  auto write_front = [&] {
    Pending& p = window.front();
    Json j;
    if (p.error) {
      j = std::move(*p.error);
      ++t.errors;
      if (audit_log) audit_log->append(audit_line(*engine, p, &j, a.audit.redact));
    } else {
      while (!p.handle.done()) {
        if (p.handle.next_for(std::chrono::milliseconds(100)) == std::nullopt) draw(false);
      }
      j = result_of(*engine, p, t);
      if (audit_log) audit_log->append(audit_line(*engine, p, nullptr, a.audit.redact));
    }
    out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    ++t.done;
    window.pop_front();
    draw(false);
  };

  LineReader reader(in);
  LineReader::Line line;
  size_t line_no = 0;
  while (reader.next(line)) {
    ++line_no;
    if (!line.too_long && blank(line.text)) continue;
    if (window.size() >= static_cast<size_t>(a.max_in_flight)) write_front();
    window.push_back(submit_line(*engine, line, line_no, a));
    while (!window.empty() && (window.front().error || window.front().handle.done())) {
      write_front();
    }
  }
  while (!window.empty()) write_front();
  results.commit();
  if (audit_log && !audit_log->flush()) {
    fmt::print(stderr,
               "batch: the audit log is not yet written after 30 s (see above); "
               "retrying until exit\n");
  }
  draw(true);
  if (progress) fmt::print(stderr, "\n");
  engine->drain();
  print_summary(t, engine->stats(),
                std::chrono::duration<double>(BatchClock::now() - start).count());
}

}  // namespace

void add_batch_command(CLI::App& app) {
  auto args = std::make_shared<BatchArgs>();
  CLI::App* sub = app.add_subcommand(
      "batch",
      "Run a JSONL file of OpenAI-style requests through one engine; one result per line, in "
      "input order");
  sub->add_option("-m,--model", args->model, "Model .gguf")->required();
  sub->add_option("-i,--input", args->input, "Requests, one JSON object per line (- : stdin)")
      ->required();
  sub->add_option("-o,--output", args->output,
                  "Results, one JSON object per line in input order (- : stdout); written to "
                  "FILE.tmp and renamed when complete");
  add_engine_flags(sub, args->engine, kComputeFlags | kPrefixFlag | kSeedFlag | kChatFlags,
                   settings::kBatch);
  add_audit_flags(sub, args->audit, settings::kBatch);
  sub->add_option("--max-in-flight", args->max_in_flight,
                  "Requests submitted ahead of the oldest unfinished one")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--chat-template", args->chat_template,
                  "Chat template family for lines with messages (default: the model's)")
      ->type_name("NAME");
  sub->add_flag("--progress", args->progress_on,
                "Progress bar on stderr (default: when stderr is a terminal)");
  sub->add_flag("--no-progress", args->progress_off, "No progress bar");
  add_setting_flag(sub, settings::kNormalizeInput, args->normalize_input);
  exclude_template_flags(sub);
  sub->callback([args] { run_batch(*args); });
}

}  // namespace encore::cli
