// See reference_forward.h. Written from the architectures' definitions
// (src/model/llama.cpp, qwen2.cpp, qwen3.cpp) and ggml's RoPE semantics, not
// from src/model/forward.cpp, so that a shared mistake is unlikely.
#include "reference_forward.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/matmul.h"
#include "model/weights.h"

namespace encore::test {
namespace {

using Vec = std::vector<double>;

// y[t] = W x[t] for every t, dequantising each weight row once.
std::vector<Vec> matmul(const kernels::WeightView& w, const std::vector<Vec>& x) {
  std::vector<Vec> y(x.size(), Vec(static_cast<size_t>(w.rows), 0.0));  // [n][rows]
  std::vector<float> row(static_cast<size_t>(w.cols));                  // [cols]
  for (int64_t r = 0; r < w.rows; ++r) {
    kernels::get_row(w, r, row.data());
    for (size_t t = 0; t < x.size(); ++t) {
      double acc = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) acc += static_cast<double>(row[c]) * x[t][c];
      y[t][r] = acc;
    }
  }
  return y;
}

void add_bias(std::vector<Vec>& y, const std::vector<float>& b) {
  if (b.empty()) return;
  for (Vec& v : y) {
    for (size_t i = 0; i < v.size(); ++i) v[i] += b[i];
  }
}

// RMSNorm of v[0, n) in place, times w[0, n).
void rmsnorm(double* v, size_t n, const std::vector<float>& w, double eps) {
  double ss = 0.0;
  for (size_t i = 0; i < n; ++i) ss += v[i] * v[i];
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
  for (size_t i = 0; i < n; ++i) v[i] = v[i] * scale * w[i];
}

Vec rmsnormed(const Vec& x, const std::vector<float>& w, double eps) {
  Vec y = x;
  rmsnorm(y.data(), y.size(), w, eps);
  return y;
}

// Rotates the first n_rot dims of each of the n_heads heads of v (ggml's
// rope with freq_factors and no YaRN): pair i turns by
//   theta_i = freq_scale * pos * base^(-2i / n_rot) / freqs[i].
// Normal pairs dims (2i, 2i + 1), NeoX pairs (i, i + n_rot / 2).
void rope(Vec& v, int n_heads, const HParams& hp, const std::vector<float>& freqs, int pos) {
  const int half = hp.n_rot / 2;
  for (int h = 0; h < n_heads; ++h) {
    double* head = v.data() + static_cast<size_t>(h) * hp.head_dim;
    for (int i = 0; i < half; ++i) {
      double theta = static_cast<double>(pos) *
                     std::pow(static_cast<double>(hp.rope_freq_base), -2.0 * i / hp.n_rot);
      if (!freqs.empty()) theta /= freqs[static_cast<size_t>(i)];
      theta *= hp.rope_freq_scale;
      const int a = hp.rope_layout == RopeLayout::NeoX ? i : 2 * i;
      const int b = hp.rope_layout == RopeLayout::NeoX ? i + half : 2 * i + 1;
      const double x0 = head[a], x1 = head[b];
      head[a] = x0 * std::cos(theta) - x1 * std::sin(theta);
      head[b] = x0 * std::sin(theta) + x1 * std::cos(theta);
    }
  }
}

// Logits of every position (all) or of the last one only.
std::vector<Vec> forward(const Model& model, std::span<const int32_t> tokens, bool all) {
  if (tokens.empty()) throw std::invalid_argument("reference_logits: no tokens");
  const HParams& hp = model.hparams();
  const ModelWeights& w = model.weights();
  const int n = static_cast<int>(tokens.size());
  const int hd = hp.head_dim;
  const int group = hp.n_head / hp.n_head_kv;  // query heads per KV head
  const double eps = hp.rms_eps;

  std::vector<Vec> x(static_cast<size_t>(n));  // [n][n_embd] residual stream
  std::vector<float> row(static_cast<size_t>(hp.n_embd));
  for (int t = 0; t < n; ++t) {
    if (tokens[t] < 0 || tokens[t] >= hp.n_vocab) {
      throw std::out_of_range("reference_logits: token id " + std::to_string(tokens[t]) +
                              " out of range");
    }
    kernels::get_row(w.token_embd, tokens[t], row.data());
    x[t].assign(row.begin(), row.end());
  }

  for (const LayerWeights& l : w.layers) {
    std::vector<Vec> xb(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) xb[t] = rmsnormed(x[t], l.attn_norm, eps);
    std::vector<Vec> q = matmul(l.wq, xb);  // [n][n_head * hd]
    std::vector<Vec> k = matmul(l.wk, xb);  // [n][n_head_kv * hd]
    std::vector<Vec> v = matmul(l.wv, xb);  // [n][n_head_kv * hd]
    add_bias(q, l.bq);
    add_bias(k, l.bk);
    add_bias(v, l.bv);
    for (int t = 0; t < n; ++t) {
      if (!l.q_norm.empty()) {
        for (int h = 0; h < hp.n_head; ++h) rmsnorm(&q[t][h * hd], hd, l.q_norm, eps);
      }
      if (!l.k_norm.empty()) {
        for (int h = 0; h < hp.n_head_kv; ++h) rmsnorm(&k[t][h * hd], hd, l.k_norm, eps);
      }
      rope(q[t], hp.n_head, hp, w.rope_freqs, t);
      rope(k[t], hp.n_head_kv, hp, w.rope_freqs, t);
    }

    std::vector<Vec> att(static_cast<size_t>(n), Vec(static_cast<size_t>(hp.n_head) * hd, 0.0));
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < hp.n_head; ++h) {
        const int g = h / group;
        Vec score(static_cast<size_t>(t + 1));  // causal: positions 0..t
        double mx = -INFINITY;
        for (int j = 0; j <= t; ++j) {
          double d = 0.0;
          for (int c = 0; c < hd; ++c) d += q[t][h * hd + c] * k[j][g * hd + c];
          score[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, score[j]);
        }
        double sum = 0.0;
        for (double& s : score) sum += (s = std::exp(s - mx));
        for (int j = 0; j <= t; ++j) {
          for (int c = 0; c < hd; ++c) att[t][h * hd + c] += score[j] / sum * v[j][g * hd + c];
        }
      }
    }
    const std::vector<Vec> o = matmul(l.wo, att);
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < hp.n_embd; ++i) x[t][i] += o[t][i];
      xb[t] = rmsnormed(x[t], l.ffn_norm, eps);
    }
    std::vector<Vec> gate = matmul(l.w_gate, xb);
    const std::vector<Vec> up = matmul(l.w_up, xb);
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < hp.n_ff; ++i) {
        const double g = gate[t][i];
        gate[t][i] = g / (1.0 + std::exp(-g)) * up[t][i];  // silu(g) * u
      }
    }
    const std::vector<Vec> down = matmul(l.w_down, gate);
    for (int t = 0; t < n; ++t) {
      for (int i = 0; i < hp.n_embd; ++i) x[t][i] += down[t][i];
    }
  }

  if (!all) x.erase(x.begin(), x.end() - 1);
  for (Vec& r : x) r = rmsnormed(r, w.output_norm, eps);
  return matmul(hp.tied_output ? w.token_embd : w.output, x);
}

}  // namespace

std::vector<std::vector<double>> reference_logits_all(const Model& model,
                                                      std::span<const int32_t> tokens) {
  return forward(model, tokens, true);
}

std::vector<double> reference_logits(const Model& model, std::span<const int32_t> tokens) {
  return std::move(forward(model, tokens, false).back());
}

}  // namespace encore::test
