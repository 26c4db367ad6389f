// `encore run`: generate text from a GGUF model, llama.cpp's flag names. A
// client of the engine like any other: the flags become one Request.
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/result_json.h"
#include "cli/setting_flags.h"
#include "encore/engine.h"
#include "encore/error.h"
#include "encore/run_state.h"

namespace encore::cli {
namespace {

struct RunArgs {
  std::string model;
  std::string prompt;
  std::string file;
  Request request;  // the table's settings (--temp, -n, --seed ...: settings.h)
  EngineFlags engine;
  bool json = false;
  bool chat = false;                  // wrap the prompt in the model's chat template
  std::optional<std::string> system;  // system message (implies chat)
  std::string chat_template;          // family name overriding the model's template (implies chat)
  std::vector<std::string> logit_bias;  // ID(+/-)BIAS
  std::string samplers;                 // stage order, e.g. "penalties;top_k;temperature"
  std::vector<std::string> stop;
  std::string save_state;
  std::string resume;
  std::string session;  // continue / save this session
};

std::string read_prompt_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("-f {}: cannot open the prompt file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// "15043+1", "15043-0.5", "15043-inf": llama.cpp's --logit-bias format.
// One sign, then a plain decimal number (no second sign, no spaces, no hex).
std::pair<TokenId, float> parse_logit_bias(const std::string& text) {
  const auto bad = [&](const char* why) {
    return InvalidArgument(fmt::format(
        "--logit-bias {}: {}; expected TOKEN_ID followed by +BIAS or -BIAS (e.g. 15043+1, "
        "2-inf)",
        text, why));
  };
  const size_t sign = text.find_first_of("+-");
  if (sign == std::string::npos || sign == 0) throw bad("no token id before a + or - sign");
  const std::string id_text = text.substr(0, sign), num = text.substr(sign + 1);
  if (id_text.find_first_not_of("0123456789") != std::string::npos || id_text.size() > 9) {
    throw bad("the token id is not a number below 10^9");
  }
  const TokenId id = std::stoi(id_text);
  if (text[sign] == '-' && num == "inf") return {id, -std::numeric_limits<float>::infinity()};
  if (num.empty() || num.find_first_not_of("0123456789.eE") != std::string::npos ||
      num.find_first_of("eE") == 0) {
    throw bad("the bias is not a plain decimal number");
  }
  double bias = 0;
  if (!CLI::detail::lexical_cast(num, bias) || !(bias <= std::numeric_limits<float>::max())) {
    throw bad("the bias is not a finite float");
  }
  return {id, static_cast<float>(text[sign] == '-' ? -bias : bias)};
}

double per_second(int64_t n, double seconds) { return seconds > 0 ? n / seconds : 0.0; }

bool info_has_no_tiers(const Engine& e) { return e.state_counters().empty(); }

// The engine names request fields (Error::field()); the user typed flags.
// The flag of a field this command fills from one, for its error messages.
std::string flag_of(const std::string& field) {
  std::string f;
  const Request any;
  visit_settings(any, [&](const settings::Setting& s, const auto&) {
    if (field == s.name) f = settings::long_flag(s);
  });
  if (!f.empty()) return f;
  static const std::pair<const char*, const char*> kFlags[] = {
      {"chat_template", "--chat-template"}, {"prompt", "-p / -f"},      {"stop", "--stop"},
      {"logit_bias", "--logit-bias"},       {"samplers", "--samplers"}, {"session", "--session"},
  };
  const std::string base = field.substr(0, field.find_first_of("[."));
  for (const auto& [name, flag] : kFlags) {
    if (base == name) return flag;
  }
  return {};
}

// e with the flag of its field added to its message.
InvalidArgument with_flag(const InvalidArgument& e) {
  const std::string flag = flag_of(e.field());
  if (flag.empty()) return e;
  return InvalidArgument(e.field(), fmt::format("{} ({})", e.message(), flag));
}

// The request from the flags: filled once, here. (With --resume it comes
// from the state file instead.)
Request request_from_flags(const RunArgs& a) {
  Request r;
  const std::string prompt = a.file.empty() ? a.prompt : read_prompt_file(a.file);
  // --chat: the prompt becomes the user message of a single-turn
  // conversation through the chat template.
  if (a.chat || a.system || !a.chat_template.empty() || !a.engine.chat_template_file.empty()) {
    if (a.system) r.messages.push_back({"system", *a.system});
    r.messages.push_back({"user", prompt});
    r.chat_template = a.chat_template;
  } else {
    r.prompt = prompt;
    r.parse_special = a.request.parse_special;
  }
  r.sampling = a.request.sampling;
  for (const std::string& b : a.logit_bias) r.sampling.logit_bias.push_back(parse_logit_bias(b));
  if (!a.samplers.empty()) r.sampling.order = parse_sampler_order(a.samplers);
  r.seed = a.request.seed;  // none: the engine draws one and reports it
  r.n = a.request.n;
  r.stop = a.stop;
  r.ignore_eos = a.request.ignore_eos;
  r.normalize_input = a.request.normalize_input;
  return r;
}

// The saved generation --resume continues, checked against -c; nullopt
// without --resume.
std::optional<RunState> load_resume(const RunArgs& a) {
  if (a.resume.empty()) return std::nullopt;
  RunState saved = load_run_state(a.resume);
  // The context size decides where a generation ends: keep the saved one.
  if (a.engine.ctx_size > 0 && a.engine.ctx_size != saved.n_ctx) {
    throw InvalidArgument(fmt::format(
        "--resume {}: the generation ran with context size {}; -c {} would end it elsewhere "
        "(omit -c)",
        a.resume, saved.n_ctx, a.engine.ctx_size));
  }
  return saved;
}

// The request the flags (or the saved generation) ask for.
Request run_request(const RunArgs& a, const std::optional<RunState>& saved, bool tiers) {
  Request request;
  try {
    request = saved ? saved->request : request_from_flags(a);
  } catch (const InvalidArgument& e) {  // --samplers
    throw with_flag(e);
  }
  request.session = a.session;
  // With state tiers, a saved generation also writes its KV blocks, so a
  // --resume restores them instead of recomputing.
  request.persist = tiers && !a.save_state.empty();
  if (!a.session.empty() && a.prompt.empty() && a.file.empty() && request.messages.empty()) {
    request.prompt.clear();  // no prompt: continue the session's generation
  }
  // Logprobs do not change what is sampled, so a resumed run may ask for
  // more of them than the original did. --json always reports the chosen
  // tokens' logprobs; --logprobs N adds the top N.
  request.logprobs = std::max({request.logprobs, a.request.logprobs, a.json ? 0 : -1});
  request.max_tokens = a.request.max_tokens;
  // One sample streams as it is generated; several are printed at the end.
  request.stream = !a.json && request.n == 1;
  return request;
}

// Engine::submit, with the engine's errors told in the flags' terms.
RequestHandle submit_run(Engine& engine, const Request& request, const RunArgs& a) {
  try {
    return engine.submit(request);
  } catch (const InvalidArgument& e) {
    if (!a.resume.empty())
      throw InvalidArgument(fmt::format("--resume {}: {}", a.resume, e.what()));
    throw with_flag(e);
  } catch (const ResourceExhausted& e) {  // the KV cache is too small for the request
    throw ResourceExhausted(fmt::format("{} (raise --kv-mem, or lower -c, -n or --n)", e.what()));
  } catch (const NotFound& e) {  // --session without a prompt, and none saved
    throw NotFound(fmt::format("{} (-p / -f)", e.what()));
  }
}

// The timings and, with state tiers, what they restored and wrote (stderr).
void print_run_stats(Engine& engine, const Response& r, const RunArgs& a, bool tiers) {
  const EngineInfo& info = engine.info();
  fmt::print(stderr, "prompt: {} tokens in {:.1f} ms ({:.1f} tok/s)\n", r.usage.prompt_tokens,
             r.prompt_seconds * 1e3, per_second(r.usage.prompt_tokens, r.prompt_seconds));
  fmt::print(stderr, "generate: {} tokens in {:.1f} ms ({:.1f} tok/s)\n", r.usage.generated_tokens,
             r.generate_seconds * 1e3, per_second(r.usage.generated_tokens, r.generate_seconds));
  fmt::print(stderr, "finish: {}, seed {}, system fingerprint {}\n",
             finish_reason_name(r.samples[0].finish), r.seed, info.system_fingerprint);
  if (!tiers) return;
  engine.drain();  // the session and blocks are written before the process ends
  const EngineStats s = engine.stats();
  fmt::print(stderr,
             "state: {} KV blocks restored ({} disk, {} redis), {} written, {} fallbacks{}{}\n",
             s.blocks_restored, s.blocks_restored_disk, s.blocks_restored_redis, s.blocks_saved,
             s.state_fallbacks, a.session.empty() ? "" : ", session ",
             a.session.empty() ? "" : (r.session_found ? "continued" : "started"));
}

void run_generate(const RunArgs& a) {
  if (!a.prompt.empty() && !a.file.empty()) {
    throw InvalidArgument("give the prompt with -p or -f, not both");
  }
  const std::optional<RunState> saved = load_resume(a);
  const bool resuming = saved.has_value();
  EngineOptions options = engine_options(a.model, a.engine, !a.session.empty());
  if (saved) options.n_ctx = saved->n_ctx;
  const std::unique_ptr<Engine> engine = Engine::open(options);
  const EngineInfo& info = engine->info();
  if (saved && saved->system_fingerprint != info.system_fingerprint) {
    throw InvalidArgument(fmt::format(
        "--resume {}: it was made under system fingerprint {} but this run has {} (another "
        "model, engine build or numerics setting such as --kv-type): continuing would not "
        "reproduce the original output",
        a.resume, saved->system_fingerprint, info.system_fingerprint));
  }
  if (info.synthetic) {
    fmt::print(stderr,
               "note: {} has random weights (made by `encore synth`): the text below is noise\n",
               a.model);
  }
  fmt::print(
      stderr,
      "load: {:.1f} ms ({}{}, {} threads, {} kernels, context {}, prefill batch {}, KV {} "
      "{:.1f} MiB in {} blocks)\n",
      info.load_seconds * 1e3, info.mmap ? "mmap" : "read into memory",
      info.panels.empty()
          ? ""
          : fmt::format(", repacked weights {:.1f} MiB ({})",
                        static_cast<double>(info.panel_bytes) / 1048576.0, info.panels),
      info.threads, isa_name(info.isa), info.n_ctx, info.batch_tokens, dtype_name(info.kv_type),
      static_cast<double>(info.kv_blocks) * static_cast<double>(info.kv_block_bytes) / 1048576.0,
      info.kv_blocks);

  const bool tiers = !info_has_no_tiers(*engine);
  const Request request = run_request(a, saved, tiers);
  const bool stream = request.stream;
  const bool chat = !request.messages.empty();
  const std::string shown_prompt = chat || resuming ? "" : request.prompt;
  RequestHandle handle = submit_run(*engine, request, a);
  if (stream) {
    fmt::print("{}", shown_prompt);
    std::fflush(stdout);
    while (const std::optional<Event> e = handle.next()) {
      if (e->text.empty()) continue;
      fmt::print("{}", e->text);
      std::fflush(stdout);
    }
  }
  const Response& r = handle.wait();
  if (r.status != Response::Status::Ok) throw ModelError(r.error);
  for (const std::string& note : r.notes) fmt::print(stderr, "note: {}\n", note);
  if (chat) {
    if (r.chat_template_hash.empty()) {
      fmt::print(stderr, "chat: template {} (from --chat-template), single turn\n",
                 r.chat_template);
    } else {
      fmt::print(stderr, "chat: Jinja template from {} (sha256 {}), single turn\n",
                 r.chat_template == "file" ? "--chat-template-file" : "tokenizer.chat_template",
                 r.chat_template_hash.substr(0, 16));
    }
  }

  if (!a.save_state.empty()) {
    save_run_state(a.save_state, run_state_after(request, r, info.system_fingerprint, info.n_ctx));
  }
  if (a.json) {
    nlohmann::ordered_json j = response_json(*engine, r, request.n, request.logprobs > 0);
    if (resuming) j["resumed_from"] = a.resume;
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else if (stream) {
    fmt::print("\n");
  } else {
    for (size_t i = 0; i < r.samples.size(); ++i) {
      fmt::print("--- sample {} ({}) ---\n{}{}\n", i, finish_reason_name(r.samples[i].finish),
                 shown_prompt, r.samples[i].text);
    }
  }
  std::fflush(stdout);
  print_run_stats(*engine, r, a, tiers);
}

}  // namespace

DType parse_kv_type(const std::string& s) {
  if (s == "f16") return DType::F16;
  if (s == "f32") return DType::F32;
  throw InvalidArgument(fmt::format("--kv-type {}: expected f16 or f32", s));
}

void add_run_command(CLI::App& app) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand("run", "Generate text from a GGUF model");
  sub->add_option("-m,--model", args->model, "Model .gguf")->required();
  CLI::Option* prompt =
      sub->add_option("-p,--prompt", args->prompt, "Prompt text (empty: BOS only)");
  CLI::Option* prompt_file =
      sub->add_option("-f,--file", args->file, "Read the prompt from a file")->excludes(prompt);
  // The request's settings (settings.h): llama.cpp's names and defaults.
  // With --resume they come from the state file, so these are refused there
  // but for -n (tokens to add) and --logprobs (they never change what is
  // sampled).
  std::vector<CLI::Option*> request_opts = {prompt, prompt_file};
  for (CLI::Option* o : add_setting_flags(sub, args->request, settings::kRun)) {
    const std::string_view flag = o->get_name();
    if (flag != settings::long_flag(settings::kLogprobs) &&
        flag != settings::long_flag(settings::kMaxTokens)) {
      request_opts.push_back(o);
    }
  }
  auto req = [&](CLI::Option* o) {
    request_opts.push_back(o);
    return o;
  };
  req(sub->add_option("--logit-bias", args->logit_bias,
                      "Add BIAS to a token's logit: ID+BIAS or ID-BIAS (ID-inf bans it); "
                      "repeatable")
          ->type_name("ID(+/-)BIAS"));
  req(sub->add_option("--samplers", args->samplers,
                      "Stage order (default penalties;top_k;typ_p;top_p;min_p;temperature)"));
  req(sub->add_option("--stop", args->stop,
                      "Stop when the text contains STR (not included in the output); repeatable")
          ->type_name("STR"));
  sub->add_option("--save-state", args->save_state,
                  "Write what is needed to continue this generation (ids, sampler state) to "
                  "FILE")
      ->type_name("FILE");
  CLI::Option* resume =
      sub->add_option("--resume", args->resume,
                      "Continue the generation saved in FILE (with -n more tokens per sample); "
                      "the request comes from the file")
          ->type_name("FILE");
  CLI::Option* session =
      sub->add_option("--session", args->session,
                      "Continue the session NAME (no prompt: its generation goes on; a prompt: "
                      "appended to its conversation) and save it at the end")
          ->type_name("NAME");
  session->excludes(resume);
  add_engine_flags(sub, args->engine, kComputeFlags | kStateFlags | kSeedFlag | kChatFlags,
                   settings::kRun);
  sub->add_flag("--json", args->json, "Print one JSON object instead of streaming text");
  sub->add_flag("--chat,--conversation", args->chat,
                "Send the prompt as a user message through the model's chat template (one turn)");
  sub->add_option("--system", args->system, "System message for --chat (implies --chat)");
  sub->add_option(
         "--chat-template", args->chat_template,
         "Chat template family instead of the model's (implies --chat): " + chat_template_names())
      ->type_name("NAME");
  CLI::Option* special = sub->get_option(std::string(settings::long_flag(settings::kParseSpecial)));
  for (const char* name : {"--chat", "--system", "--chat-template", "--chat-template-file"}) {
    special->excludes(sub->get_option(name));
    request_opts.push_back(sub->get_option(name));
  }
  exclude_template_flags(sub);
  for (CLI::Option* o : request_opts) resume->excludes(o);
  sub->callback([args] { run_generate(*args); });
}

}  // namespace encore::cli
