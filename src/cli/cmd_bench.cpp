// `encore bench`: prefill and decode speed of a model on this machine, next
// to what the machine can do (memory bandwidth roofline, compute peak), and
// the engine's throughput and prefix cache (include/encore/bench.h).
#include <fmt/format.h>

#include <unistd.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "encore/bench.h"
#include "encore/engine.h"
#include "encore/error.h"
#include "encore/synth.h"
#include "encore/thread_pool.h"

namespace encore::cli {
namespace {

struct BenchArgs {
  std::vector<std::string> models;
  std::string synth_preset = "1b";  // with types: synthesise one model per type
  std::vector<std::string> types;   // synth type names (Q4_0, Q4_K_M, ...)
  std::string synth_dir;            // where those models are written (and removed)
  BenchOptions bench;
  EngineFlags engine;
  bool json = false;
};

// One row of the table of several models: the speed measures only (the
// engine's throughput, prefix and session measures are for one model).
struct TypeRow {
  std::string label;  // the type, or the model's file name
  uint64_t file_bytes = 0;
  BenchReport r;
  int threads = 0;
  Isa isa = Isa::Scalar;
};

TypeRow bench_one(const std::string& label, const std::string& path, const BenchArgs& a) {
  EngineOptions eo = engine_options(path, a.engine, false);
  eo.log = nullptr;
  const std::unique_ptr<Engine> engine = Engine::open(eo);
  BenchOptions o = a.bench;
  o.n_requests = 0;
  o.n_prefix = 0;
  o.state_dir.clear();
  o.redis_url.clear();
  if (!a.json) fmt::print(stderr, "bench: {} ...\n", label);
  TypeRow row{label, std::filesystem::file_size(path), encore::run_bench(*engine, o)};
  row.threads = engine->info().threads;
  row.isa = engine->info().isa;
  return row;
}

// `--types` / several `-m`: one model after another, a table (or a JSON
// object with a row per model) of load, prefill, decode and batched decode
// against the machine's peaks measured alongside each.
void run_table(const BenchArgs& a) {
  std::vector<TypeRow> rows;
  if (!a.types.empty()) {
    const std::filesystem::path dir = a.synth_dir.empty() ? std::filesystem::temp_directory_path()
                                                          : std::filesystem::path(a.synth_dir);
    ThreadPool pool(a.engine.threads > 0 ? a.engine.threads : default_threads());
    // Every name and the preset are checked before the first (slow) model.
    std::vector<SynthOptions> plans;
    for (const std::string& t : a.types) {
      SynthOptions so;
      so.preset = a.synth_preset;
      set_synth_type(so, t);
      plans.push_back(so);
    }
    synth_shape(a.synth_preset);  // throws for an unknown preset
    for (size_t k = 0; k < plans.size(); ++k) {
      const std::string& t = a.types[k];
      const SynthOptions& so = plans[k];
      const std::string path =
          (dir / fmt::format("encore-bench-{}-{}-{}.gguf", getpid(), a.synth_preset, t)).string();
      // The model is removed however its row ends.
      struct Remove {
        std::string p;
        ~Remove() {
          std::error_code ec;
          std::filesystem::remove(p, ec);
        }
      } remove{path};
      if (!a.json) fmt::print(stderr, "bench: synthesising {} {} ...\n", a.synth_preset, t);
      synth_model(so, path, pool);
      rows.push_back(bench_one(t, path, a));
    }
  } else {
    for (const std::string& m : a.models) {
      rows.push_back(bench_one(std::filesystem::path(m).filename().string(), m, a));
    }
  }
  const BenchOptions& o = a.bench;
  if (a.json) {
    nlohmann::ordered_json j;
    j["threads"] = rows.empty() ? 0 : rows.front().threads;
    j["isa"] = rows.empty() ? "" : isa_name(rows.front().isa);
    j["prefill_tokens"] = o.n_prompt;
    j["decode_batch"] = o.n_batch;
    j["rows"] = nlohmann::ordered_json::array();
    for (const TypeRow& row : rows) {
      const BenchReport& r = row.r;
      j["rows"].push_back({{"type", row.label},
                           {"file_mib", row.file_bytes / 1048576.0},
                           {"load_ms", r.load_ms},
                           {"prefill_tok_s", r.prefill_tok_s},
                           {"prefill_peak", r.prefill_peak},
                           {"prefill_peak_fraction", r.prefill_gops / r.prefill_peak},
                           {"decode_tok_s", r.decode_tok_s},
                           {"decode_roofline_fraction", r.decode_tok_s / r.roofline_tok_s},
                           {"batch_tok_s", r.batch_tok_s},
                           {"batch_speedup", r.batch_tok_s / r.decode_tok_s},
                           {"bandwidth_gb_s", r.bandwidth_gb_s},
                           {"roofline_tok_s", r.roofline_tok_s},
                           {"peak_fma_gflops", r.peak_fma_gflops},
                           {"peak_int8_gops", r.peak_int8_gops}});
    }
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print(
      "| type | MiB | load ms | prefill {} tok/s | % of peak | decode tok/s | % of roofline "
      "| {} streams tok/s | x batch 1 |\n",
      o.n_prompt, o.n_batch);
  fmt::print("|---|---|---|---|---|---|---|---|---|\n");
  for (const TypeRow& row : rows) {
    const BenchReport& r = row.r;
    fmt::print(
        "| {} | {:.0f} | {:.0f} | {:.1f} | {:.0f} % | {:.2f} | {:.0f} % | {:.2f} | {:.2f} |\n",
        row.label, row.file_bytes / 1048576.0, r.load_ms, r.prefill_tok_s,
        100.0 * r.prefill_gops / r.prefill_peak, r.decode_tok_s,
        100.0 * r.decode_tok_s / r.roofline_tok_s, r.batch_tok_s, r.batch_tok_s / r.decode_tok_s);
  }
  if (!rows.empty()) {
    const BenchReport& r = rows.back().r;
    fmt::print(
        "\nread bandwidth {:.1f} GB/s, peak FMA {:.0f} GFLOP/s, peak int8 {:.0f} GOP/s "
        "(measured with the last row); % of peak: int8 for the quantised types, FMA for "
        "F16/BF16/F32\n",
        r.bandwidth_gb_s, r.peak_fma_gflops, r.peak_int8_gops);
  }
}

void run_bench(const BenchArgs& a) {
  if (!a.types.empty() || a.models.size() > 1) return run_table(a);
  if (a.models.empty()) throw InvalidArgument("encore bench: give a model (-m) or --types");
  const std::string& model = a.models.front();
  EngineOptions eo = engine_options(model, a.engine, false);
  eo.log = nullptr;
  const std::unique_ptr<Engine> engine = Engine::open(eo);
  const EngineInfo& info = engine->info();
  const BenchOptions& o = a.bench;
  if (!a.json) {
    fmt::print(stderr, "bench: {} ({}{}, loaded in {:.0f} ms), {} threads, {} kernels, KV {}\n",
               model, info.mmap ? "mmap" : "read into memory",
               info.panels.empty() ? "" : ", weights repacked in " + info.panels,
               info.load_seconds * 1e3, info.threads, isa_name(info.isa), dtype_name(info.kv_type));
  }
  const BenchReport r = encore::run_bench(*engine, o);
  if (a.json) {
    nlohmann::ordered_json j;
    j["model"] = model;
    j["threads"] = info.threads;
    j["isa"] = isa_name(info.isa);
    j["kv_type"] = dtype_name(info.kv_type);
    j["mmap"] = info.mmap;
    j["panels"] = info.panels;
    j["load_ms"] = r.load_ms;
    j["prefill_tokens"] = o.n_prompt;
    j["prefill_tok_s"] = r.prefill_tok_s;
    j["decode_tok_s"] = r.decode_tok_s;
    j["decode_batch"] = o.n_batch;
    // "decode_batch8_tok_s" with the default --batch 8.
    j[fmt::format("decode_batch{}_tok_s", o.n_batch)] = r.batch_tok_s;
    j["batch_speedup"] = r.batch_tok_s / r.decode_tok_s;
    j["bandwidth_gb_s"] = r.bandwidth_gb_s;
    j["weight_bytes_per_token"] = r.weight_bytes_per_token;
    j["roofline_tok_s"] = r.roofline_tok_s;
    j["decode_roofline_fraction"] = r.decode_tok_s / r.roofline_tok_s;
    j["macs_per_token"] = r.macs_per_token;
    j["prefill_gops"] = r.prefill_gops;
    j["peak_fma_gflops"] = r.peak_fma_gflops;
    j["peak_int8_gops"] = r.peak_int8_gops;
    j["prefill_peak"] = r.prefill_peak;
    j["prefill_peak_fraction"] = r.prefill_gops / r.prefill_peak;
    if (o.n_requests > 0) {
      j["requests"] = o.n_requests;
      j["sequential_tok_s"] = r.sequential_tok_s;
      j["batch_throughput_tok_s"] = r.batch_throughput_tok_s;
      j["batch_throughput_speedup"] = r.batch_throughput_tok_s / r.sequential_tok_s;
    }
    if (r.session_tokens > 0) {
      j["session_tokens"] = r.session_tokens;
      j["recompute_ms"] = r.recompute_ms;
      // The first tier measured (the directory, else Redis).
      j["restore_ms"] = !o.state_dir.empty() ? r.restore_disk_ms : r.restore_redis_ms;
      j["restore_speedup"] = r.recompute_ms / j["restore_ms"].get<double>();
      if (!o.state_dir.empty()) {
        j["restore_disk_ms"] = r.restore_disk_ms;
        j["restore_disk_bytes"] = r.restore_disk_bytes;
      }
      if (!o.redis_url.empty()) {
        j["restore_redis_ms"] = r.restore_redis_ms;
        j["restore_redis_bytes"] = r.restore_redis_bytes;
      }
    }
    if (r.prefix_tokens > 0) {
      j["prefix_tokens"] = r.prefix_tokens;
      j["cold_ttft_ms"] = r.cold_ttft_ms;
      j["warm_ttft_ms"] = r.warm_ttft_ms;
      j["warm_ttft_fraction"] = r.warm_ttft_ms / r.cold_ttft_ms;
      j["warm_cached_tokens"] = r.warm_cached_tokens;
    }
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("{:<30} {:>12}\n", "measure", "value");
  fmt::print("{:<30} {:>12.1f}  ({} tokens; {:.1f} GOP/s = {:.1f} % of peak)\n", "prefill tok/s",
             r.prefill_tok_s, o.n_prompt, r.prefill_gops, 100.0 * r.prefill_gops / r.prefill_peak);
  fmt::print("{:<30} {:>12.2f}  ({:.1f} % of roofline)\n", "decode tok/s (batch 1)", r.decode_tok_s,
             100.0 * r.decode_tok_s / r.roofline_tok_s);
  fmt::print("{:<30} {:>12.2f}  ({:.2f}x batch 1)\n",
             fmt::format("decode tok/s (batch {})", o.n_batch), r.batch_tok_s,
             r.batch_tok_s / r.decode_tok_s);
  fmt::print("{:<30} {:>12.2f}\n", "read bandwidth GB/s", r.bandwidth_gb_s);
  fmt::print("{:<30} {:>12.1f}\n", "weight MiB per token", r.weight_bytes_per_token / 1048576.0);
  fmt::print("{:<30} {:>12.2f}\n", "roofline tok/s", r.roofline_tok_s);
  fmt::print("{:<30} {:>12.1f}\n", "peak FMA GFLOP/s", r.peak_fma_gflops);
  fmt::print("{:<30} {:>12.1f}\n", "peak int8 GOP/s", r.peak_int8_gops);
  if (o.n_requests > 0) {
    fmt::print("{:<30} {:>12.2f}  ({} requests one at a time)\n", "engine sequential tok/s",
               r.sequential_tok_s, o.n_requests);
    fmt::print("{:<30} {:>12.2f}  ({:.2f}x sequential)\n", "engine concurrent tok/s",
               r.batch_throughput_tok_s, r.batch_throughput_tok_s / r.sequential_tok_s);
  }
  if (r.prefix_tokens > 0) {
    fmt::print("{:<30} {:>12.1f}  ({}-token prefix computed)\n", "cold TTFT ms", r.cold_ttft_ms,
               r.prefix_tokens);
    fmt::print("{:<30} {:>12.1f}  ({:.1f} % of cold; {} tokens from the cache)\n", "warm TTFT ms",
               r.warm_ttft_ms, 100.0 * r.warm_ttft_ms / r.cold_ttft_ms, r.warm_cached_tokens);
  }
  if (r.session_tokens > 0) {
    fmt::print("{:<30} {:>12.1f}  ({}-token session recomputed)\n", "recompute TTFT ms",
               r.recompute_ms, r.session_tokens);
    for (int t = 0; t < 2; ++t) {
      const double ms = t == 0 ? r.restore_disk_ms : r.restore_redis_ms;
      if ((t == 0 ? o.state_dir : o.redis_url).empty()) continue;
      fmt::print("{:<30} {:>12.1f}  ({:.1f}x faster; {:.1f} MiB read)\n",
                 t == 0 ? "restore TTFT ms (disk)" : "restore TTFT ms (redis)", ms,
                 r.recompute_ms / ms,
                 (t == 0 ? r.restore_disk_bytes : r.restore_redis_bytes) / 1048576.0);
    }
  }
  fmt::print("{:<30} {:>12.1f}\n", "load ms", r.load_ms);
}

}  // namespace

void add_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand(
      "bench", "Measure prefill/decode speed against this machine's bandwidth and compute peak");
  sub->add_option("-m,--model", args->models,
                  "Model .gguf (several: a table of their speeds, one row each)");
  sub->add_option("--types", args->types,
                  "A table over these types (e.g. Q8_0,Q4_0,Q4_K_M,F16), each model made by "
                  "`encore synth --preset` --synth")
      ->delimiter(',');
  sub->add_option("--synth", args->synth_preset, "The synth preset of --types")
      ->capture_default_str();
  sub->add_option("--synth-dir", args->synth_dir,
                  "Where the --types models are written, one at a time, and removed (default: the "
                  "temp folder; a 1b F16 model takes 2.1 GB)")
      ->type_name("DIR");
  add_engine_flags(sub, args->engine, kComputeFlags, settings::kBench);
  sub->add_option("-p,--n-prompt", args->bench.n_prompt, "Prefill length in tokens")
      ->check(CLI::Range(1, 1 << 16));
  sub->add_option("-n,--n-gen", args->bench.n_gen, "Decode steps per measurement")
      ->check(CLI::Range(1, 1 << 16));
  sub->add_option("--batch", args->bench.n_batch, "Concurrent sequences of the batched decode")
      ->check(CLI::Range(1, 256));
  sub->add_option("--bw-mib", args->bench.bw_mib, "Buffer of the bandwidth probe in MiB")
      ->check(CLI::Range(16.0, 65536.0));
  sub->add_option("--requests", args->bench.n_requests,
                  "Requests of the engine throughput measure, all at once vs one at a time "
                  "(0: skip)")
      ->check(CLI::Range(0, 4096));
  sub->add_option("--request-prompt", args->bench.request_prompt,
                  "Prompt tokens of each of those requests")
      ->check(CLI::Range(1, 1 << 16));
  sub->add_option("--prefix", args->bench.n_prefix,
                  "Shared prefix of the time-to-first-token measure, cold vs cached (0: skip)")
      ->check(CLI::Range(0, 1 << 20));
  sub->add_option("--state-dir", args->bench.state_dir,
                  "Measure restoring a session's KV from this directory vs recomputing it")
      ->type_name("DIR");
  sub->add_option("--redis", args->bench.redis_url, "The same from Redis (redis://HOST:PORT)")
      ->type_name("URL");
  sub->add_option("--session-tokens", args->bench.n_session, "Length of that session")
      ->check(CLI::Range(16, 1 << 20));
  sub->add_flag("--json", args->json, "Print one JSON object");
  sub->callback([args] {
    if (!args->types.empty() && !args->models.empty()) {
      throw InvalidArgument("encore bench: --types makes its own models; leave -m out");
    }
    run_bench(*args);
  });
}

}  // namespace encore::cli
