// `encore run`: generate text from a GGUF model, llama.cpp's flag names.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>

#include "cli/commands.h"
#include "encore/chat_template.h"
#include "encore/engine.h"
#include "encore/error.h"
#include "encore/fingerprint.h"
#include "encore/gguf.h"
#include "encore/isa.h"
#include "encore/kv_cache.h"
#include "encore/model.h"
#include "encore/thread_pool.h"
#include "encore/tokenizer.h"

namespace encore::cli {
namespace {

struct RunArgs {
  std::string model;
  std::string prompt;
  std::string file;
  int32_t n_predict = -1;
  float temp = 0.8f;
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

// A seed nobody chose: drawn from the OS entropy source and reported back,
// so that the output can be reproduced later with --seed.
uint64_t entropy_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
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

void run_generate(const RunArgs& a) {
  if (!a.prompt.empty() && !a.file.empty()) {
    throw InvalidArgument("give the prompt with -p or -f, not both");
  }
  if (a.temp < 0.0f) throw InvalidArgument(fmt::format("--temp {} must be >= 0", a.temp));
  const std::string prompt = a.file.empty() ? a.prompt : read_prompt_file(a.file);
  const uint64_t seed = a.seed ? *a.seed : entropy_seed();
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
  const int32_t n_ctx = a.ctx_size > 0 ? a.ctx_size : std::min(hp.n_ctx_train, kDefaultMaxCtx);
  const KvLayout layout = kv_layout_for(hp, parse_kv_type(a.kv_type));
  const uint64_t kv_bytes = a.kv_mem_mib > 0 ? static_cast<uint64_t>(a.kv_mem_mib * 1048576.0)
                                             : kv_bytes_for_tokens(layout, n_ctx);
  KvBlockPool pool(layout, kv_bytes);
  ThreadPool threads(n_threads);
  ForwardContext ctx(*model, pool, threads, n_ctx,
                     a.isa.empty() ? std::optional<Isa>() : parse_isa(a.isa));
  bool fp_cached = false;
  const std::string fingerprint = model_fingerprint_cached(file, threads, &fp_cached);
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start)
          .count();

  if (file.opt_bool("encore.synthetic").value_or(false)) {
    fmt::print(stderr,
               "note: {} has random weights (made by `encore synth`): the text below is noise\n",
               a.model);
  }
  fmt::print(stderr,
             "load: {:.1f} ms ({}, {} threads, {} kernels, context {}, KV {} {:.1f} MiB in {} "
             "blocks)\n",
             load_ms, a.mmap ? "mmap" : "read into memory", n_threads, isa_name(ctx.isa()), n_ctx,
             dtype_name(layout.elem_type), pool.n_blocks() * layout.block_bytes() / 1048576.0,
             pool.n_blocks());

  // --chat: the prompt becomes the user message of a single-turn
  // conversation, rendered without a leading BOS (the tokenizer adds it
  // according to add_bos) and tokenized with special tokens parsed, since the
  // template is made of them. Special-token text typed in the prompt or the
  // system message is parsed too, as in llama.cpp.
  const bool chat = a.chat || a.system.has_value() || !a.chat_template.empty();
  std::string chat_name;
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

  // An empty prompt means BOS only (whatever add_bos says).
  Tokenizer::EncodeOptions enc;
  // BOS/EOS as the model's metadata asks (add_bos_token / add_eos_token),
  // as llama.cpp tokenizes prompts.
  enc.add_bos = tokenizer->vocab().add_bos;
  enc.add_eos = tokenizer->vocab().add_eos;
  enc.parse_special = chat || a.special;
  std::vector<TokenId> prompt_ids = tokenizer->encode(text, enc);
  const TokenId bos = tokenizer->vocab().bos;
  if (enc.add_bos && prompt_ids.size() >= 2 && prompt_ids[0] == bos && prompt_ids[1] == bos) {
    // The text began with the BOS token's own text (--special): one BOS only.
    prompt_ids.erase(prompt_ids.begin());
    fmt::print(stderr, "note: the prompt starts with the BOS text; not adding a second BOS\n");
  }
  if (prompt_ids.empty() || (text.empty() && prompt_ids.front() != bos)) {
    if (tokenizer->vocab().bos < 0) {
      throw ModelError(
          fmt::format("{}: the prompt is empty and the vocabulary has no BOS token", a.model));
    }
    prompt_ids.insert(prompt_ids.begin(), tokenizer->vocab().bos);
  }
  // The SPM dummy-prefix space of the first word is dropped when the text
  // starts right after BOS, as llama.cpp renders it.
  const bool after_bos_only = prompt_ids.size() == 1 && prompt_ids[0] == tokenizer->vocab().bos;

  GenerateParams params;
  params.n_predict = a.n_predict;
  params.temp = a.temp;
  params.seed = seed;
  params.prefill_chunk = a.batch_size;

  StreamDecoder stream(*tokenizer, after_bos_only);
  // In chat mode only the answer is printed, not the template around it.
  if (!a.json && !chat) {
    fmt::print("{}", prompt);
    std::fflush(stdout);
  }
  const GenerateResult r = generate(ctx, *tokenizer, prompt_ids, params, [&](TokenId id) {
    if (a.json) return;
    fmt::print("{}", stream.push(id));
    std::fflush(stdout);
  });

  if (a.json) {
    nlohmann::ordered_json j;
    j["prompt_ids"] = prompt_ids;
    j["ids"] = r.ids;
    j["text"] = tokenizer->decode(r.ids, false, after_bos_only);
    j["seed"] = seed;
    j["model_fingerprint"] = fingerprint;
    j["finish_reason"] = finish_reason_name(r.finish);
    j["n_ctx"] = n_ctx;
    if (chat) j["chat_template"] = chat_name;
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    fmt::print("{}\n", stream.finish());
  }
  std::fflush(stdout);
  fmt::print(stderr, "prompt: {} tokens in {:.1f} ms ({:.1f} tok/s)\n", prompt_ids.size(),
             r.prompt_seconds * 1e3, per_second(prompt_ids.size(), r.prompt_seconds));
  fmt::print(stderr, "generate: {} tokens in {:.1f} ms ({:.1f} tok/s)\n", r.ids.size(),
             r.generate_seconds * 1e3, per_second(r.ids.size(), r.generate_seconds));
  fmt::print(stderr, "finish: {} ({}), seed {}, fingerprint {}\n", finish_reason_name(r.finish),
             r.finish == FinishReason::Eog      ? "end-of-generation token"
             : r.finish == FinishReason::Length ? "reached -n"
                                                : "context full (-c)",
             seed, fingerprint);
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
  sub->add_option("-f,--file", args->file, "Read the prompt from a file")->excludes(prompt);
  sub->add_option("-n,--n-predict", args->n_predict,
                  "Tokens to generate (-1: until EOS or context full)")
      ->check(CLI::Range(-1, std::numeric_limits<int32_t>::max()));
  sub->add_option("--temp", args->temp, "Temperature (0: greedy argmax, ties to the lowest id)")
      ->check(finite_range(0.0, 1e6));
  sub->add_option("--seed", args->seed, "Seed of the sampler (default: random, reported)");
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
  sub->callback([args] { run_generate(*args); });
}

}  // namespace encore::cli
