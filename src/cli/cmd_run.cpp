// `encore run`: generate text from a GGUF model, llama.cpp's flag names.
#include <fmt/format.h>
#include <sys/random.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "cli/run_state.h"
#include "encore/chat_template.h"
#include "encore/engine.h"
#include "encore/error.h"
#include "encore/fingerprint.h"
#include "encore/gguf.h"
#include "encore/isa.h"
#include "encore/kv_cache.h"
#include "encore/model.h"
#include "encore/sampler.h"
#include "encore/thread_pool.h"
#include "encore/tokenizer.h"

namespace encore::cli {
namespace {

struct RunArgs {
  std::string model;
  std::string prompt;
  std::string file;
  int32_t n_predict = -1;
  std::optional<uint64_t> seed;
  int threads = 0;
  int32_t ctx_size = 0;
  double kv_mem_mib = 0;
  bool json = false;
  bool mmap = false;
  bool chat = false;                  // wrap the prompt in the model's chat template
  std::optional<std::string> system;  // system message (implies chat)
  std::string chat_template;          // family name overriding the model's template (implies chat)
  bool special = false;               // parse special-token text in a plain prompt
  std::string kv_type = "f16";        // KV cache element type: f16 | f32
  int32_t batch_size = 512;           // prefill chunk (tokens per step)
  std::string isa;                    // kernels: scalar | avx2 | avx512 (default: best)
  SamplingParams sampling;            // --temp, --top-k ... (temp lives here)
  std::vector<std::string> logit_bias;  // ID(+/-)BIAS
  std::string samplers;                 // stage order, e.g. "penalties;top_k;temperature"
  std::vector<std::string> stop;
  int32_t n_samples = 1;
  int32_t logprobs = -1;  // -1: not asked
  std::string save_state;
  std::string resume;
};

constexpr int32_t kDefaultMaxCtx = 4096;
// Larger contexts than any GGUF model in use; bounds the scratch buffers.
constexpr int32_t kMaxCtx = 1 << 20;

std::string read_prompt_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("-f {}: cannot open the prompt file", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A seed nobody chose: drawn from the OS entropy source (getrandom(2), not
// std::random_device, whose source is implementation-defined) and reported
// back, so that the output can be reproduced later with --seed.
uint64_t entropy_seed() {
  uint64_t seed = 0;
  auto* p = reinterpret_cast<unsigned char*>(&seed);
  size_t got = 0;
  while (got < sizeof seed) {
    const ssize_t r = getrandom(p + got, sizeof seed - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      throw InvalidArgument(
          fmt::format("cannot draw a random seed from the OS (getrandom: {}): pass --seed N",
                      std::strerror(errno)));
    }
    got += static_cast<size_t>(r);
  }
  return seed;
}

double per_second(size_t n, double seconds) { return seconds > 0 ? n / seconds : 0.0; }

// The chat family to use: --chat-template NAME, else the one recognised in
// the model's tokenizer.chat_template. `source` says which, for the log.
ChatTemplate pick_chat_template(const RunArgs& a, const gguf::File& file, std::string* source) {
  if (!a.chat_template.empty()) {
    *source = "--chat-template";
    return chat_template_from_name(a.chat_template);
  }
  const std::optional<std::string> tmpl = file.opt_string("tokenizer.chat_template");
  if (!tmpl) {
    throw InvalidArgument(
        fmt::format("{} has no tokenizer.chat_template: pass --chat-template NAME (one of: {})",
                    a.model, chat_template_names()));
  }
  *source = "tokenizer.chat_template";
  try {
    return detect_chat_template(*tmpl);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("{}: tokenizer.chat_template: {}", a.model, e.what()));
  }
}

// Token ids of the prompt text: BOS/EOS as the model's metadata asks
// (add_bos_token / add_eos_token), as llama.cpp tokenizes prompts. An empty
// prompt means BOS only (whatever add_bos says).
std::vector<TokenId> encode_prompt(const Tokenizer& tok, const std::string& text,
                                   bool parse_special, const std::string& model) {
  Tokenizer::EncodeOptions enc;
  enc.add_bos = tok.vocab().add_bos;
  enc.add_eos = tok.vocab().add_eos;
  enc.parse_special = parse_special;
  std::vector<TokenId> ids = tok.encode(text, enc);
  const TokenId bos = tok.vocab().bos;
  if (enc.add_bos && ids.size() >= 2 && ids[0] == bos && ids[1] == bos) {
    // The text began with the BOS token's own text (--special): one BOS only.
    ids.erase(ids.begin());
    fmt::print(stderr, "note: the prompt starts with the BOS text; not adding a second BOS\n");
  }
  if (ids.empty() || (text.empty() && ids.front() != bos)) {
    if (bos < 0) {
      throw ModelError(
          fmt::format("{}: the prompt is empty and the vocabulary has no BOS token", model));
    }
    ids.insert(ids.begin(), bos);
  }
  return ids;
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

// The request's settings from the flags (with --resume they come from the
// file instead). The seed is resolved here, once: --seed, else one drawn from
// the OS; every later use (sampler, --json, --save-state, stderr) reads p.seed.
GenerateParams request_params(const RunArgs& a, int32_t n_ctx) {
  GenerateParams p;
  p.seed = a.seed ? *a.seed : entropy_seed();
  p.sampling = a.sampling;
  for (const std::string& b : a.logit_bias) p.sampling.logit_bias.push_back(parse_logit_bias(b));
  if (!a.samplers.empty()) p.sampling.order = parse_sampler_order(a.samplers);
  if (p.sampling.repeat_last_n < 0) p.sampling.repeat_last_n = n_ctx;
  p.n_samples = a.n_samples;
  // --json always reports the chosen tokens' logprobs; --logprobs N adds the top N.
  p.logprobs = a.logprobs >= 0 ? a.logprobs : (a.json ? 0 : -1);
  p.stop = a.stop;
  return p;
}

nlohmann::ordered_json logprobs_json(const std::vector<LogprobEntry>& entries, const Tokenizer& tok,
                                     bool with_top) {
  auto one = [&](const TokenLogprob& t) {
    nlohmann::ordered_json o;
    o["id"] = t.id;
    o["token"] = tok.token_to_piece(t.id, true);
    o["logprob"] = t.logprob;
    return o;
  };
  nlohmann::ordered_json arr = nlohmann::ordered_json::array();
  for (const LogprobEntry& e : entries) {
    nlohmann::ordered_json o = one(e.chosen);
    if (with_top) {
      o["top_logprobs"] = nlohmann::ordered_json::array();
      for (const TokenLogprob& t : e.top) o["top_logprobs"].push_back(one(t));
    }
    arr.push_back(o);
  }
  return arr;
}

void run_generate(const RunArgs& a) {
  if (!a.prompt.empty() && !a.file.empty()) {
    throw InvalidArgument("give the prompt with -p or -f, not both");
  }
  const bool resuming = !a.resume.empty();
  std::optional<RunState> saved;
  if (resuming) saved = load_run_state(a.resume);
  const std::string prompt = a.file.empty() ? a.prompt : read_prompt_file(a.file);
  const int n_threads = a.threads > 0 ? a.threads : default_threads();

  const auto load_start = std::chrono::steady_clock::now();
  const gguf::File file =
      gguf::File::open(a.model, a.mmap ? gguf::LoadMode::Mmap : gguf::LoadMode::Read);
  const std::unique_ptr<Model> model = Model::load(file);
  const std::unique_ptr<Tokenizer> tokenizer = Tokenizer::create(vocab_from_gguf(file));
  const HParams& hp = model->hparams();
  if (tokenizer->n_vocab() != hp.n_vocab) {
    throw ModelError(fmt::format("{}: the tokenizer has {} tokens but the model's vocabulary is {}",
                                 a.model, tokenizer->n_vocab(), hp.n_vocab));
  }
  if (a.ctx_size < 0) throw InvalidArgument(fmt::format("-c {} must be >= 0", a.ctx_size));
  int32_t n_ctx = a.ctx_size > 0 ? a.ctx_size : std::min(hp.n_ctx_train, kDefaultMaxCtx);
  if (saved) {  // the context size decides where a generation ends: keep the saved one
    if (a.ctx_size > 0 && a.ctx_size != saved->n_ctx) {
      throw InvalidArgument(fmt::format(
          "--resume {}: the generation ran with context size {}; -c {} would end it elsewhere "
          "(omit -c)",
          a.resume, saved->n_ctx, a.ctx_size));
    }
    n_ctx = saved->n_ctx;
  }
  const DType kv_type = parse_kv_type(a.kv_type);
  const KvLayout layout = kv_layout_for(hp, kv_type);
  GenerateParams params = saved ? saved->params : request_params(a, n_ctx);
  // Logprobs do not change what is sampled, so a resumed run may ask for
  // more of them than the original did.
  params.logprobs = std::max({params.logprobs, a.logprobs, a.json ? 0 : -1});
  params.n_predict = a.n_predict;
  params.prefill_chunk = a.batch_size;
  params.validate(hp.n_vocab);
  // Room for every sample to fill the context. Only address space: pages are
  // committed when blocks are first written.
  const uint64_t kv_bytes = a.kv_mem_mib > 0 ? static_cast<uint64_t>(a.kv_mem_mib * 1048576.0)
                                             : static_cast<uint64_t>(params.n_samples) *
                                                   kv_bytes_for_tokens(layout, n_ctx);
  KvBlockPool pool(layout, kv_bytes);
  ThreadPool threads(n_threads);
  ForwardContext ctx(*model, pool, threads, n_ctx,
                     a.isa.empty() ? std::optional<Isa>() : parse_isa(a.isa));
  bool fp_cached = false;
  const std::string fingerprint = model_fingerprint_cached(file, threads, &fp_cached);
  NumericsSettings numerics;
  numerics.kv_type = kv_type;
  numerics.rope_freq_base = hp.rope_freq_base;
  numerics.rope_freq_scale = hp.rope_freq_scale;
  const std::string system_fp = system_fingerprint(fingerprint, numerics);
  if (saved && saved->system_fingerprint != system_fp) {
    throw InvalidArgument(fmt::format(
        "--resume {}: it was made under system fingerprint {} but this run has {} (another "
        "model, engine build or numerics setting such as --kv-type): continuing would not "
        "reproduce the original output",
        a.resume, saved->system_fingerprint, system_fp));
  }
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start)
          .count();

  if (file.opt_bool("encore.synthetic").value_or(false)) {
    fmt::print(stderr,
               "note: {} has random weights (made by `encore synth`): the text below is noise\n",
               a.model);
  }
  fmt::print(stderr,
             "load: {:.1f} ms ({}, {} threads, {} kernels, context {}, prefill batch {}, KV {} "
             "{:.1f} MiB in {} blocks)\n",
             load_ms, a.mmap ? "mmap" : "read into memory", n_threads, isa_name(ctx.isa()), n_ctx,
             a.batch_size, dtype_name(layout.elem_type),
             pool.n_blocks() * layout.block_bytes() / 1048576.0, pool.n_blocks());

  std::vector<TokenId> prompt_ids;
  bool chat = false;
  std::string chat_name;
  if (saved) {
    prompt_ids = saved->prompt_ids;
    for (TokenId id : prompt_ids) {
      if (id < 0 || id >= hp.n_vocab) {
        throw InvalidArgument(
            fmt::format("--resume {}: prompt token id {} is outside the "
                        "vocabulary [0, {})",
                        a.resume, id, hp.n_vocab));
      }
    }
  } else {
    // --chat: the prompt becomes the user message of a single-turn
    // conversation, rendered without a leading BOS (the tokenizer adds it
    // according to add_bos) and tokenized with special tokens parsed, since
    // the template is made of them. Special-token text typed in the prompt or
    // the system message is parsed too, as in llama.cpp.
    chat = a.chat || a.system.has_value() || !a.chat_template.empty();
    std::string text = prompt;
    if (chat) {
      std::string source;
      const ChatTemplate family = pick_chat_template(a, file, &source);
      chat_name = chat_template_name(family);
      std::vector<ChatMessage> messages;
      if (a.system) messages.push_back({"system", *a.system});
      messages.push_back({"user", prompt});
      text = render_chat(family, messages, /*add_generation_prompt=*/true, tokenizer->vocab());
      fmt::print(stderr, "chat: template {} (from {}), single turn\n", chat_name, source);
    }
    prompt_ids = encode_prompt(*tokenizer, text, chat || a.special, a.model);
    // The SPM dummy-prefix space of the first word is dropped when the text
    // starts right after BOS, as llama.cpp renders it.
    params.strip_leading_space = prompt_ids.size() == 1 && prompt_ids[0] == tokenizer->vocab().bos;
  }

  // One sample streams as it is generated; several are printed at the end.
  const bool stream = !a.json && params.n_samples == 1;
  if (stream && !chat && !resuming) {
    fmt::print("{}", prompt);
    std::fflush(stdout);
  }
  const auto run = [&] {
    return generate(
        ctx, *tokenizer, prompt_ids, params,
        [&](int, TokenId, std::string_view text) {
          if (!stream) return;
          fmt::print("{}", text);
          std::fflush(stdout);
        },
        saved ? &saved->samples : nullptr);
  };
  GenerateResult r;
  try {
    r = run();
  } catch (const InvalidArgument& e) {
    if (!saved) throw;
    throw InvalidArgument(fmt::format("--resume {}: {}", a.resume, e.what()));
  }

  if (!a.save_state.empty()) {
    save_run_state(a.save_state, RunState{system_fp, prompt_ids, n_ctx, params, r.states});
  }
  if (a.json) {
    auto choice = [&](const SampleResult& s) {
      nlohmann::ordered_json c;
      c["ids"] = s.ids;
      c["text"] = s.text;
      // params, not the flag: with --resume the request (and its --logprobs N)
      // comes from the state file.
      c["logprobs"] = logprobs_json(s.logprobs, *tokenizer, params.logprobs > 0);
      c["finish_reason"] = finish_reason_name(s.finish);
      c["output_hash"] = output_hash(s.ids);
      return c;
    };
    nlohmann::ordered_json j;
    j["prompt_ids"] = prompt_ids;
    if (params.n_samples == 1) {
      j.update(choice(r.samples[0]));
    } else {
      j["choices"] = nlohmann::ordered_json::array();
      for (size_t i = 0; i < r.samples.size(); ++i) {
        nlohmann::ordered_json c;
        c["index"] = i;
        c.update(choice(r.samples[i]));
        j["choices"].push_back(c);
      }
    }
    j["seed"] = params.seed;
    j["system_fingerprint"] = system_fp;
    j["model_fingerprint"] = fingerprint;
    j["n_ctx"] = n_ctx;
    if (resuming) j["resumed_from"] = a.resume;
    if (chat) j["chat_template"] = chat_name;
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else if (stream) {
    fmt::print("\n");
  } else {
    for (size_t i = 0; i < r.samples.size(); ++i) {
      fmt::print("--- sample {} ({}) ---\n{}{}\n", i, finish_reason_name(r.samples[i].finish),
                 chat || resuming ? "" : prompt, r.samples[i].text);
    }
  }
  std::fflush(stdout);
  size_t n_generated = 0;
  for (const SampleResult& s : r.samples) n_generated += s.ids.size();
  fmt::print(stderr, "prompt: {} tokens in {:.1f} ms ({:.1f} tok/s)\n", prompt_ids.size(),
             r.prompt_seconds * 1e3, per_second(prompt_ids.size(), r.prompt_seconds));
  fmt::print(stderr, "generate: {} tokens in {:.1f} ms ({:.1f} tok/s)\n", n_generated,
             r.generate_seconds * 1e3, per_second(n_generated, r.generate_seconds));
  fmt::print(stderr, "finish: {}, seed {}, system fingerprint {}\n",
             finish_reason_name(r.samples[0].finish), params.seed, system_fp);
}

// CLI::Range lets NaN through (every comparison with NaN is false).
CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !std::isfinite(v) || v < lo || v > hi) {
          return fmt::format("value {} is not a number in [{}, {}]", text, lo, hi);
        }
        return "";
      },
      fmt::format("NUMBER in [{}, {}]", lo, hi));
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
  sub->add_option("-n,--n-predict", args->n_predict,
                  "Tokens to generate (-1: until EOS or context full)")
      ->check(CLI::Range(-1, std::numeric_limits<int32_t>::max()));
  CLI::Option* seed =
      sub->add_option("--seed", args->seed, "Seed of the sampler (default: random, reported)");
  SamplingParams& sp = args->sampling;
  // Sampling flags: llama.cpp's names and defaults. With --resume the
  // request's settings come from the state file, so these are refused there.
  std::vector<CLI::Option*> request_opts = {prompt, prompt_file, seed};
  auto req = [&](CLI::Option* o) {
    request_opts.push_back(o);
    return o;
  };
  req(sub->add_option("--temp", sp.temp, "Temperature (0: greedy argmax, ties to the lowest id)")
          ->check(finite_range(0.0, 1e6))
          ->capture_default_str());
  req(sub->add_option("--top-k", sp.top_k, "Keep the K most likely tokens (0: off)")
          ->check(CLI::Range(0, std::numeric_limits<int32_t>::max()))
          ->capture_default_str());
  req(sub->add_option("--top-p", sp.top_p, "Nucleus sampling (1: off)")
          ->check(finite_range(0.0, 1.0))
          ->capture_default_str());
  req(sub->add_option("--min-p", sp.min_p, "Drop tokens below P x the top probability (0: off)")
          ->check(finite_range(0.0, 1.0))
          ->capture_default_str());
  req(sub->add_option("--typical", sp.typical_p, "Locally typical sampling (1: off)")
          ->check(finite_range(0.0, 1.0))
          ->capture_default_str());
  req(sub->add_option("--repeat-penalty", sp.repeat_penalty, "Repetition penalty (1: off)")
          ->check(finite_range(1e-6, 1e6))
          ->capture_default_str());
  req(sub->add_option("--repeat-last-n", sp.repeat_last_n,
                      "Tokens the penalties look back over (0: off, -1: the context)")
          ->check(CLI::Range(-1, kMaxCtx))
          ->capture_default_str());
  req(sub->add_option("--presence-penalty", sp.presence_penalty, "Presence penalty (0: off)")
          ->check(finite_range(-1e6, 1e6))
          ->capture_default_str());
  req(sub->add_option("--frequency-penalty", sp.frequency_penalty, "Frequency penalty (0: off)")
          ->check(finite_range(-1e6, 1e6))
          ->capture_default_str());
  req(sub->add_option("--logit-bias", args->logit_bias,
                      "Add BIAS to a token's logit: ID+BIAS or ID-BIAS (ID-inf bans it); "
                      "repeatable")
          ->type_name("ID(+/-)BIAS"));
  req(sub->add_option("--samplers", args->samplers,
                      "Stage order (default penalties;top_k;typ_p;top_p;min_p;temperature)"));
  req(sub->add_option("--stop", args->stop,
                      "Stop when the text contains STR (not included in the output); repeatable")
          ->type_name("STR"));
  req(sub->add_option("--n", args->n_samples,
                      "Samples of the prompt; sample i is the same whatever N is")
          ->check(CLI::Range(1, kMaxSamples)));
  sub->add_option("--logprobs", args->logprobs,
                  "With --json: also the N most likely tokens at each position (allowed with "
                  "--resume: logprobs never change what is sampled)")
      ->check(CLI::Range(0, kMaxTopLogprobs));
  sub->add_option("--save-state", args->save_state,
                  "Write what is needed to continue this generation (ids, sampler state) to "
                  "FILE")
      ->type_name("FILE");
  CLI::Option* resume =
      sub->add_option("--resume", args->resume,
                      "Continue the generation saved in FILE (with -n more tokens per sample); "
                      "the request comes from the file")
          ->type_name("FILE");
  sub->add_option("-t,--threads", args->threads, "Threads (default: all cores)")
      ->check(CLI::Range(1, ThreadPool::kMaxThreads));
  sub->add_option("-c,--ctx-size", args->ctx_size,
                  "Context size in tokens (0: model's, at most 4096)")
      ->check(CLI::Range(0, kMaxCtx));
  sub->add_option("--kv-mem", args->kv_mem_mib, "KV cache budget in MiB (default: what -c needs)")
      ->check(finite_range(0.0, 1 << 24));
  sub->add_option("--kv-type", args->kv_type,
                  "KV cache element type: f16 (default, like llama.cpp) or f32; part of the "
                  "numerics: outputs are reproducible under either, not across them");
  sub->add_option("-b,--batch-size", args->batch_size,
                  "Prompt tokens per forward step (chunked prefill; speed only)")
      ->check(CLI::Range(1, 1 << 20));
  sub->add_option("--isa", args->isa,
                  "Kernels: scalar, avx2 or avx512 (default: ENCORE_ISA, else the best the CPU "
                  "has); speed only, outputs are identical");
  sub->add_flag("--json", args->json, "Print one JSON object instead of streaming text");
  sub->add_flag("--mmap,!--no-mmap", args->mmap,
                "Map the weights instead of reading them into memory");
  sub->add_flag("--chat,--conversation", args->chat,
                "Send the prompt as a user message through the model's chat template (one turn)");
  sub->add_option("--system", args->system, "System message for --chat (implies --chat)");
  sub->add_option(
         "--chat-template", args->chat_template,
         "Chat template family instead of the model's (implies --chat): " + chat_template_names())
      ->type_name("NAME");
  sub->add_flag("--special", args->special,
                "Parse special-token text in the prompt (<s>, <|im_start|>...) as special tokens");
  for (const char* name : {"--chat", "--system", "--chat-template", "--special"}) {
    request_opts.push_back(sub->get_option(name));
  }
  for (CLI::Option* o : request_opts) resume->excludes(o);
  sub->callback([args] { run_generate(*args); });
}

}  // namespace encore::cli
