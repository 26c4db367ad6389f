// `encore synth`: write a GGUF model of a real shape with random weights.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <memory>

#include "cli/commands.h"
#include "encore/error.h"
#include "encore/synth.h"
#include "encore/thread_pool.h"

namespace encore::cli {
namespace {

struct SynthArgs {
  std::string out;
  std::string arch;  // "" = the preset's
  std::string preset = "tiny";
  std::string type = "F16";
  std::string vocab_from;
  uint64_t seed = 0;
  int threads = 0;
};

void run_synth(const SynthArgs& a) {
  SynthOptions o;
  o.arch = a.arch;
  o.preset = a.preset;
  o.vocab_from = a.vocab_from;
  o.seed = a.seed;
  set_synth_type(o, a.type);
  ThreadPool pool(a.threads > 0 ? a.threads : default_threads());
  const auto start = std::chrono::steady_clock::now();
  const SynthSummary s = synth_model(o, a.out, pool);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  fmt::print(
      "wrote {}: arch {}, preset {}, type {}, {:.1f}M parameters, {:.1f} MiB, vocab {} ({}), "
      "dim {}, {} layers, {} heads / {} KV heads, FFN {}, context {}, seed {} ({:.2f} s)\n"
      "note: the weights are random; text generated from this model is noise\n",
      a.out, s.shape.arch, s.shape.preset, o.k_m_mix ? a.type : std::string(dtype_name(o.type)),
      s.n_params / 1e6, s.file_bytes / 1048576.0, s.shape.n_vocab,
      a.vocab_from.empty() ? "built-in" : a.vocab_from, s.shape.n_embd, s.shape.n_layer,
      s.shape.n_head, s.shape.n_head_kv, s.shape.n_ff, s.shape.n_ctx, o.seed, secs);
}

}  // namespace

void add_synth_command(CLI::App& app) {
  auto args = std::make_shared<SynthArgs>();
  CLI::App* sub =
      app.add_subcommand("synth", "Write a GGUF of a real model's shape with random weights");
  sub->add_option("-o,--output", args->out, "Output .gguf path")->required();
  sub->add_option("--arch", args->arch,
                  "Architecture (default: the preset's; must match it if given)");
  sub->add_option("--preset", args->preset,
                  fmt::format("Shape: {}", fmt::join(synth_presets(), ", ")));
  sub->add_option(
      "--type", args->type,
      "Type of the 2-D weights: F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K, or "
      "the mixes Q4_K_M Q5_K_M (as llama-quantize makes them)");
  sub->add_option("--vocab-from", args->vocab_from, "Copy the tokenizer from this GGUF");
  sub->add_option("--seed", args->seed, "Seed of the random weights");
  sub->add_option("-t,--threads", args->threads, "Threads (default: all cores)");
  sub->callback([args] { run_synth(*args); });
}

}  // namespace encore::cli
