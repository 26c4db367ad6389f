// `encore inspect`: metadata, tensor table, totals and content fingerprint.
#include <fmt/format.h>

#include <chrono>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "encore/fingerprint.h"
#include "encore/gguf.h"
#include "encore/thread_pool.h"
#include "util/text.h"

namespace encore::cli {
namespace {

struct InspectArgs {
  std::string model;
  int threads = 0;
  size_t max_items = 8;
};

void run_inspect(const InspectArgs& a) {
  const gguf::File file = gguf::File::open(a.model, gguf::LoadMode::Mmap);
  fmt::print("file: {}\n", file.path());
  fmt::print("GGUF version {}, {} bytes, alignment {}, {} metadata keys, {} tensors\n\n",
             file.version(), file.file_size(), file.alignment(), file.metadata().size(),
             file.tensors().size());

  fmt::print("metadata:\n");
  for (const gguf::KeyValue& kv : file.metadata()) {
    std::string type = gguf::value_type_name(kv.value.type);
    if (kv.value.type == gguf::ValueType::ARRAY) {
      type = fmt::format("{}[{}]", gguf::value_type_name(kv.value.elem), kv.value.arr.size());
    }
    // Keys and names are untrusted text: escaped so they cannot inject
    // terminal control sequences.
    fmt::print("  {:<44} {:<14} {}\n", util::printable(kv.key), type,
               kv.value.to_string(a.max_items));
  }

  fmt::print("\ntensors:\n  {:<36} {:<6} {:<16} {:>14}\n", "name", "type", "shape", "bytes");
  uint64_t total_bytes = 0, total_params = 0;
  std::map<std::string, uint64_t> bytes_by_type;
  for (const gguf::TensorInfo& t : file.tensors()) {
    fmt::print("  {:<36} {:<6} {:<16} {:>14}\n", util::printable(t.name), dtype_name(t.type),
               gguf::shape_string(t.dims), t.n_bytes);
    total_bytes += t.n_bytes;
    total_params += t.n_elements;
    bytes_by_type[dtype_name(t.type)] += t.n_bytes;
  }
  fmt::print(
      "\ntotals: {} tensors, {} parameters ({:.2f}M), {} bytes of tensor data ({:.2f} MiB)\n",
      file.tensors().size(), total_params, total_params / 1e6, total_bytes,
      total_bytes / 1048576.0);
  for (const auto& [type, bytes] : bytes_by_type) {
    fmt::print("  {:<6} {:>14} bytes\n", type, bytes);
  }

  ThreadPool pool(a.threads > 0 ? a.threads : default_threads());
  const auto start = std::chrono::steady_clock::now();
  bool from_cache = false;
  const std::string fp = model_fingerprint_cached(file, pool, &from_cache);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  fmt::print("\nfingerprint: {} ({:.1f} ms, {})\n", fp, ms,
             from_cache ? "from cache (file unchanged since it was hashed)" : "hashed");
  if (file.opt_bool("encore.synthetic").value_or(false)) {
    fmt::print("note: synthetic model with random weights (made by `encore synth`)\n");
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* sub = app.add_subcommand("inspect", "Print a GGUF's metadata, tensors and fingerprint");
  sub->add_option("model", args->model, "Model .gguf")->required();
  sub->add_option("-t,--threads", args->threads, "Threads used to hash (default: all cores)");
  sub->add_option("--max-items", args->max_items, "Array items to show per metadata value");
  sub->callback([args] { run_inspect(*args); });
}

}  // namespace encore::cli
