// `encore replay FILE... -m MODEL`: verifies an audit log's chain, then runs
// every logged request again through one engine and reports, per request,
// identical / differs (where) / skipped (why); the summary last. Exit 1 if
// any request differs or the chain is broken (include/encore/audit.h,
// docs/audit.md).
#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>

#include "audit/line.h"
#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "encore/audit.h"
#include "encore/engine.h"
#include "encore/error.h"

namespace encore::cli {
namespace {

using Json = nlohmann::ordered_json;

struct ReplayArgs {
  std::vector<std::string> files;
  std::string model;
  EngineFlags engine;
  std::string from, to, tenant, inputs;
  bool tenant_given = false;
  bool json = false;
  int window = 64;
  bool progress_on = false, progress_off = false;
  CLI::App* sub = nullptr;
};

// Request lines in the files (the progress bar's total): a cheap scan.
int64_t count_requests(const std::vector<std::string>& files) {
  int64_t n = 0;
  for (const std::string& f : files) {
    audit::LineReader reader(f);
    audit::LineReader::Got got;
    while (reader.next(got)) {
      if (got.text.find("\"type\":\"request\"") != std::string::npos) ++n;
    }
  }
  return n;
}

void run_replay(const ReplayArgs& a) {
  // The numerics the log was written under, unless the flags say otherwise.
  EngineOptions eo = engine_options(a.model, a.engine, false);
  if (const std::optional<audit::LoggedNumerics> logged = audit::first_numerics(a.files)) {
    if (a.sub->get_option("--ctx-size")->count() == 0) eo.n_ctx = logged->n_ctx;
    if (a.sub->get_option("--kv-type")->count() == 0) {
      std::string kv = logged->kv_type;  // as dtype_name() spells it: "F16"
      for (char& ch : kv) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      eo.kv_type = parse_kv_type(kv);
    }
  }
  const std::unique_ptr<Engine> engine = Engine::open(eo);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(a.model);
  const EngineInfo& info = engine->info();
  fmt::print(stderr, "replay: {} ({}, context {}, KV {}, {} threads, {})\n", a.model,
             info.model_fingerprint, info.n_ctx, dtype_name(info.kv_type), info.threads,
             isa_name(info.isa));

  audit::ReplayOptions ro;
  ro.files = a.files;
  ro.from_id = a.from;
  ro.to_id = a.to;
  if (a.tenant_given) ro.tenant = a.tenant;
  ro.inputs = a.inputs;
  ro.window = a.window;
  const bool progress = !a.progress_off && (a.progress_on || isatty(STDERR_FILENO) != 0);
  const int64_t total = progress ? count_requests(a.files) : 0;
  auto last = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  if (progress) {
    ro.progress = [&](int64_t done, int64_t) {
      const auto now = std::chrono::steady_clock::now();
      if (now - last < std::chrono::milliseconds(100)) return;
      last = now;
      fmt::print(stderr, "\r[{}/{}] replayed", done, total);
    };
  }
  const auto token_text = [&](TokenId id) {
    return id >= 0 && id < tok->vocab().n_vocab() ? tok->token_to_piece(id, true) : std::string();
  };
  const audit::ReplaySummary sum = audit::replay(*engine, ro, token_text);
  if (progress) fmt::print(stderr, "\n");

  const auto dump = [](const Json& j) {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  for (const audit::ReplayResult& r : sum.results) {
    if (a.json) {
      Json j;
      j["id"] = r.id;
      j["seq"] = r.seq;
      j["tenant"] = r.tenant;
      j["verdict"] = r.verdict;
      j["detail"] = r.detail;
      fmt::print("{}\n", dump(j));
    } else {
      fmt::print("{:<9} {}  {}\n", r.verdict, r.id.empty() ? fmt::format("seq {}", r.seq) : r.id,
                 r.detail);
    }
  }
  const audit::VerifyReport& c = sum.chain;
  if (a.json) {
    Json s;
    s["requests"] = sum.results.size();
    s["identical"] = sum.identical;
    s["differs"] = sum.differs;
    s["skipped"] = sum.skipped;
    s["chain_ok"] = c.ok();
    s["broken"] = c.ok() ? Json(nullptr) : Json(c.broken);
    s["notes"] = c.notes;
    s["head"] = c.head;
    if (!sum.engine_note.empty()) s["note"] = sum.engine_note;
    Json j;
    j["summary"] = std::move(s);
    fmt::print("{}\n", dump(j));
  } else {
    for (const std::string& n : c.notes) fmt::print("note: {}\n", n);
    if (!sum.engine_note.empty()) fmt::print("note: {}\n", sum.engine_note);
    if (!c.ok()) fmt::print("broken: {} (lines after it were not replayed)\n", c.broken);
    fmt::print(
        "replay: {} requests: {} identical, {} differ, {} skipped; chain {} ({} lines, "
        "head {})\n",
        sum.results.size(), sum.identical, sum.differs, sum.skipped, c.ok() ? "ok" : "BROKEN",
        c.lines, c.head.empty() ? "-" : c.head);
  }
  if (sum.differs > 0 || !c.ok()) std::exit(1);
}

}  // namespace

void add_replay_command(CLI::App& app) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* sub = app.add_subcommand(
      "replay",
      "Verify an audit log, run every logged request again and compare the outputs bit for bit "
      "(identical / differs / skipped); exit 1 if any differs or the chain is broken");
  args->sub = sub;
  sub->add_option("files", args->files, "The log's files (FILE FILE.1 ...), in any order")
      ->required();
  sub->add_option("-m,--model", args->model, "Model .gguf")->required();
  sub->add_option("--from", args->from, "Start at the request with this id");
  sub->add_option("--to", args->to, "End at the request with this id");
  sub->add_option("--tenant", args->tenant, "Only this tenant's requests")
      ->each([args](const std::string&) { args->tenant_given = true; });
  sub->add_option("--inputs", args->inputs,
                  "Prompt (and output) ids for a redacted log: lines with \"id\" and "
                  "request.prompt.ids, as an unredacted log writes them")
      ->type_name("FILE");
  sub->add_option("--window", args->window, "Requests in flight at once")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  sub->add_flag("--json", args->json, "One JSON object per request, then a summary object");
  sub->add_flag("--progress", args->progress_on,
                "Progress on stderr (default: when stderr is a terminal)");
  sub->add_flag("--no-progress", args->progress_off, "No progress");
  add_engine_flags(sub, args->engine, kComputeFlags | kPrefixFlag, settings::kBatch);
  sub->callback([args] { run_replay(*args); });
}

}  // namespace encore::cli
