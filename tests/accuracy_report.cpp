// accuracy_report: how far the engine's logits are from the double-precision
// reference forward pass (tests/reference_forward.h), one line per model.
//
//   accuracy_report [--isa scalar|avx2|avxvnni|avx512] [--kv f32|f16] [--threads N]
//                   [--tokens N] model.gguf...
//
// Every model gets the same token sequence: its BOS id (tokenizer.ggml.
// bos_token_id, else 1), then ids drawn by std::mt19937(20240607) modulo
// n_vocab. The engine (ForwardContext, F32 KV cache unless --kv f16) is fed
// one token per step and its logits are kept at every position; the
// invariance contract (docs/invariance.md) makes them equal, bit for bit, to
// those of any other split of the sequence, thread count or ISA.
//
// Per position: rel_inf = ||engine - ref||_inf / ||ref||_inf, rel_l2 the
// same with the L2 norm, KL(p_ref || p_engine) of the softmax distributions
// (in double, natural log). Each column reports the max or mean over the
// positions. Not a test: nothing is asserted, nothing is registered with ctest.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "encore/dtype.h"
#include "encore/gguf.h"
#include "encore/isa.h"
#include "encore/kv_cache.h"
#include "encore/model.h"
#include "encore/thread_pool.h"
#include "reference_forward.h"

namespace {

using namespace encore;

// "Q4_K+Q6_K": the matrices' types, most elements first.
std::string type_name(const gguf::File& f) {
  std::map<DType, uint64_t> elems;
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (t.dims.size() >= 2) elems[t.type] += t.n_elements;
  }
  std::vector<std::pair<uint64_t, DType>> v;
  for (const auto& [type, n] : elems) v.emplace_back(n, type);
  std::sort(v.rbegin(), v.rend());
  std::string s;
  for (const auto& [n, type] : v) {
    if (!s.empty()) s += '+';
    s += dtype_name(type);
  }
  return s;
}

std::vector<int32_t> token_sequence(const gguf::File& f, int n, int n_vocab) {
  std::mt19937 rng(20240607);
  std::vector<int32_t> t{
      static_cast<int32_t>(f.opt_u32("tokenizer.ggml.bos_token_id").value_or(1))};
  while (static_cast<int>(t.size()) < n) {
    t.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(n_vocab)));
  }
  return t;
}

// log(sum(exp(x))), stable.
double log_sum_exp(std::span<const double> x) {
  const double m = *std::max_element(x.begin(), x.end());
  double s = 0.0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

struct Stats {
  double max = 0.0, sum = 0.0;
  void add(double x) {
    max = std::max(max, x);
    sum += x;
  }
};

void report(const std::string& path, std::optional<Isa> isa, DType kv, int threads, int n_tokens) {
  const gguf::File file = gguf::File::open(path);
  const std::unique_ptr<Model> model = Model::load(file);
  const int n_vocab = model->hparams().n_vocab;
  const std::vector<int32_t> tokens = token_sequence(file, n_tokens, n_vocab);
  const std::vector<std::vector<double>> ref = test::reference_logits_all(*model, tokens);

  const KvLayout layout = kv_layout_for(model->hparams(), kv);
  KvBlockPool pool(layout, kv_bytes_for_tokens(layout, n_tokens));
  ThreadPool tp(threads);
  model->repack_weights(tp);  // as the engine runs it
  ForwardContext ctx(*model, pool, tp, n_tokens, isa);
  KvSequence seq;
  std::vector<float> got(static_cast<size_t>(n_vocab));
  std::vector<double> g(got.size());
  Stats inf, l2, kl;
  for (size_t pos = 0; pos < tokens.size(); ++pos) {
    ctx.eval(seq, std::span(tokens).subspan(pos, 1), got);
    const std::vector<double>& r = ref[pos];
    double d_inf = 0.0, r_inf = 0.0, d_l2 = 0.0, r_l2 = 0.0;
    for (size_t i = 0; i < r.size(); ++i) {
      g[i] = got[i];
      const double d = std::isfinite(got[i]) ? std::fabs(g[i] - r[i]) : INFINITY;
      d_inf = std::max(d_inf, d);
      r_inf = std::max(r_inf, std::fabs(r[i]));
      d_l2 += d * d;
      r_l2 += r[i] * r[i];
    }
    inf.add(d_inf / r_inf);
    l2.add(std::sqrt(d_l2 / r_l2));
    // KL(p || q) = sum p (log p - log q), log p = r - lse(r), log q = g - lse(g).
    const double lse_r = log_sum_exp(r), lse_g = log_sum_exp(g);
    double k = 0.0;
    for (size_t i = 0; i < r.size(); ++i) {
      const double log_p = r[i] - lse_r;
      k += std::exp(log_p) * (log_p - (g[i] - lse_g));
    }
    kl.add(k);
  }
  seq.release(pool);
  const double n = static_cast<double>(tokens.size());
  std::printf("%-16s %-6s %4zu  %9.3e %9.3e  %9.3e %9.3e  %9.3e %9.3e  %s\n",
              type_name(file).c_str(), isa_name(ctx.isa()), tokens.size(), inf.max, inf.sum / n,
              l2.max, l2.sum / n, kl.max, kl.sum / n, path.c_str());
  std::fflush(stdout);
}

int usage() {
  std::fprintf(
      stderr,
      "usage: accuracy_report [--isa scalar|avx2|avxvnni|avx512] [--kv f32|f16] [--threads N] "
      "[--tokens N] model.gguf...\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::optional<Isa> isa;
  DType kv = DType::F32;
  int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  int n_tokens = 48;
  std::vector<std::string> paths;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const bool has_value = i + 1 < argc;
      if (a == "--isa" && has_value) {
        isa = parse_isa(argv[++i]);
      } else if (a == "--kv" && has_value) {
        kv = dtype_from_name(argv[++i]).value_or(DType::Q4_0);
        if (kv != DType::F32 && kv != DType::F16) return usage();
      } else if (a == "--threads" && has_value) {
        threads = std::atoi(argv[++i]);
      } else if (a == "--tokens" && has_value) {
        n_tokens = std::atoi(argv[++i]);
      } else if (a.starts_with("--")) {
        return usage();
      } else {
        paths.push_back(a);
      }
    }
    if (paths.empty() || threads < 1 || n_tokens < 1) return usage();
    std::printf("# KV %s, %d threads, %d tokens; rel = ||engine - ref|| / ||ref|| per position\n",
                dtype_name(kv), threads, n_tokens);
    std::printf("%-16s %-6s %4s  %9s %9s  %9s %9s  %9s %9s  %s\n", "type", "isa", "pos", "max_inf",
                "mean_inf", "max_l2", "mean_l2", "max_kl", "mean_kl", "file");
    for (const std::string& p : paths) report(p, isa, kv, threads, n_tokens);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "accuracy_report: %s\n", e.what());
    return 1;
  }
  return 0;
}
