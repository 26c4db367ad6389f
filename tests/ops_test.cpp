// Scalar kernels against straightforward double-precision references, plus
// the invariances the forward pass relies on (thread count, batch size).
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "encore/thread_pool.h"
#include "kernels/quants.h"

namespace encore::kernels {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A weight matrix stored as `type`, plus its exact float values.
struct TestMatrix {
  std::vector<uint8_t> bytes;  // [rows, row_bytes]
  std::vector<float> values;   // [rows, cols] dequantised
  WeightView view;
};

TestMatrix make_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  TestMatrix m;
  const std::vector<float> src = random_vec(static_cast<size_t>(rows * cols), seed, 0.5f);
  const size_t row_bytes = static_cast<size_t>(dtype_row_bytes(type, static_cast<uint64_t>(cols)));
  m.bytes.resize(row_bytes * static_cast<size_t>(rows));
  m.values.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, src.data() + r * cols, m.bytes.data() + r * row_bytes, cols);
    dequantize_row(type, m.bytes.data() + r * row_bytes, m.values.data() + r * cols, cols);
  }
  m.view = WeightView{type, m.bytes.data(), rows, cols, row_bytes};
  return m;
}

class MatmulTest : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulTest, MatchesDoubleReferenceAndIsThreadCountInvariant) {
  const DType type = GetParam();
  const int64_t rows = 67, cols = 256, m = 5;  // above kMinParallelWork: really threaded
  const TestMatrix w = make_matrix(type, rows, cols, 7);
  const std::vector<float> x = random_vec(static_cast<size_t>(m * cols), 11);

  std::vector<float> y_serial(static_cast<size_t>(m * rows));
  matmul(w.view, x.data(), y_serial.data(), m, nullptr);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t r = 0; r < rows; ++r) {
      double ref = 0.0, mag = 0.0;
      for (int64_t c = 0; c < cols; ++c) {
        const double p = static_cast<double>(w.values[r * cols + c]) * x[i * cols + c];
        ref += p;
        mag += std::fabs(p);
      }
      EXPECT_NEAR(y_serial[i * rows + r], ref, 1e-6 * mag + 1e-7) << "row " << r << " tok " << i;
    }
  }

  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    std::vector<float> y(static_cast<size_t>(m * rows));
    matmul(w.view, x.data(), y.data(), m, &pool);
    EXPECT_EQ(0, std::memcmp(y.data(), y_serial.data(), y.size() * sizeof(float)))
        << threads << " threads";
  }

  // A batch gives exactly what each token alone gives.
  for (int64_t i = 0; i < m; ++i) {
    std::vector<float> y1(static_cast<size_t>(rows));
    matmul(w.view, x.data() + i * cols, y1.data(), 1, nullptr);
    EXPECT_EQ(0, std::memcmp(y1.data(), y_serial.data() + i * rows, y1.size() * sizeof(float)));
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulTest,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0,
                                           DType::Q4_0, DType::Q4_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Ops, GetRowDequantisesOneRow) {
  const TestMatrix w = make_matrix(DType::Q8_0, 4, 64, 3);
  std::vector<float> row(64);
  get_row(w.view, 2, row.data());
  for (int c = 0; c < 64; ++c) EXPECT_EQ(row[c], w.values[2 * 64 + c]);
}

TEST(Ops, DotSumsInIndexOrder) {
  // 1e8 + 1 - 1e8 in float: in index order the 1 is lost; adding the two
  // large terms first would keep it.
  const float a[3] = {1e8f, 1.0f, -1e8f};
  const float b[3] = {1.0f, 1.0f, 1.0f};
  EXPECT_EQ(dot(a, b, 3), 0.0f);
}

TEST(Ops, RmsNormMatchesDouble) {
  const int n = 173;
  const std::vector<float> x = random_vec(n, 1, 3.0f);
  const std::vector<float> w = random_vec(n, 2);
  std::vector<float> out(n);
  rmsnorm(out.data(), x.data(), w.data(), n, 1e-5f);
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double scale = 1.0 / std::sqrt(ss / n + 1e-5);
  for (int i = 0; i < n; ++i)
    EXPECT_NEAR(out[i], x[i] * scale * w[i], 1e-5 * std::fabs(x[i] * scale * w[i]) + 1e-6);
  // In place.
  std::vector<float> y = x;
  rmsnorm(y.data(), y.data(), w.data(), n, 1e-5f);
  EXPECT_EQ(y, out);
}

TEST(Ops, SoftmaxMatchesDoubleAndSurvivesLargeInputs) {
  std::vector<float> x = {1000.0f, 1001.0f, 999.5f, -1e30f};
  softmax(x.data(), 4);
  const double e0 = std::exp(-1.0), e2 = std::exp(-1.5), s = e0 + 1.0 + e2;
  EXPECT_NEAR(x[0], e0 / s, 1e-6);
  EXPECT_NEAR(x[1], 1.0 / s, 1e-6);
  EXPECT_NEAR(x[2], e2 / s, 1e-6);
  EXPECT_EQ(x[3], 0.0f);

  std::vector<float> r = random_vec(50, 5, 4.0f);
  std::vector<double> ref(r.begin(), r.end());
  softmax(r.data(), 50);
  double mx = ref[0], sum = 0.0;
  for (double v : ref) mx = std::max(mx, v);
  for (double& v : ref) sum += (v = std::exp(v - mx));
  for (int i = 0; i < 50; ++i) EXPECT_NEAR(r[i], ref[i] / sum, 1e-6);
}

TEST(Ops, SwigluMatchesDouble) {
  const std::vector<float> g = random_vec(100, 8, 3.0f), u = random_vec(100, 9);
  std::vector<float> out(100);
  swiglu(out.data(), g.data(), u.data(), 100);
  for (int i = 0; i < 100; ++i) {
    const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-7);
  }
  EXPECT_EQ(silu(0.0f), 0.0f);
}

// Double-precision rotation of pair (a, b) by pos * base^(-2i/n_rot).
void rotate_ref(double* a, double* b, int64_t pos, int i, int n_rot, double base) {
  const double theta = static_cast<double>(pos) * std::pow(base, -2.0 * i / n_rot);
  const double x0 = *a, x1 = *b;
  *a = x0 * std::cos(theta) - x1 * std::sin(theta);
  *b = x0 * std::sin(theta) + x1 * std::cos(theta);
}

TEST(Ops, RopeAdjacentAndNeoxMatchDouble) {
  const int n_heads = 3, head_dim = 16, n_rot = 12, half = n_rot / 2;
  const float base = 10000.0f;
  for (int64_t pos : {0, 1, 7, 100}) {
    std::vector<float> cs(half), sn(half);
    rope_cos_sin(pos, n_rot, base, cs.data(), sn.data());
    const std::vector<float> x = random_vec(n_heads * head_dim, 21);
    for (bool neox : {false, true}) {
      std::vector<float> got = x;
      if (neox) {
        rope_neox(got.data(), n_heads, head_dim, n_rot, cs.data(), sn.data());
      } else {
        rope_adjacent(got.data(), n_heads, head_dim, n_rot, cs.data(), sn.data());
      }
      std::vector<double> ref(x.begin(), x.end());
      for (int h = 0; h < n_heads; ++h) {
        double* v = ref.data() + h * head_dim;
        for (int i = 0; i < half; ++i) {
          if (neox) {
            rotate_ref(&v[i], &v[i + half], pos, i, n_rot, base);
          } else {
            rotate_ref(&v[2 * i], &v[2 * i + 1], pos, i, n_rot, base);
          }
        }
      }
      for (int j = 0; j < n_heads * head_dim; ++j) {
        EXPECT_NEAR(got[j], ref[j], 2e-5 * (1 + pos)) << "pos " << pos << " neox " << neox;
        if (j % head_dim >= n_rot || pos == 0) EXPECT_EQ(got[j], x[j]);  // untouched dims
      }
    }
  }
}

TEST(Ops, AttentionHeadOverPagedBlocksMatchesDouble) {
  const int head_dim = 8, n_kv_heads = 2, block_tokens = 4, n_kv = 11;
  const int64_t stride = n_kv_heads * head_dim;
  // Blocks deliberately out of order in memory.
  std::vector<float> storage_k = random_vec(3 * block_tokens * stride, 31);
  std::vector<float> storage_v = random_vec(3 * block_tokens * stride, 32);
  const int order[3] = {2, 0, 1};
  std::vector<const float*> kb, vb;
  for (int b : order) {
    kb.push_back(storage_k.data() + b * block_tokens * stride);
    vb.push_back(storage_v.data() + b * block_tokens * stride);
  }
  PagedKv kv{kb.data(), vb.data(), block_tokens, stride};
  const std::vector<float> q = random_vec(head_dim, 33);
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int g = 0; g < n_kv_heads; ++g) {
    std::vector<float> scores(n_kv), out(head_dim);
    attention_head(q.data(), kv, g, n_kv, head_dim, scale, scores.data(), out.data());
    std::vector<double> s(n_kv);
    double mx = -1e300, sum = 0.0;
    for (int j = 0; j < n_kv; ++j) {
      const float* k = kb[j / block_tokens] + (j % block_tokens) * stride + g * head_dim;
      double d = 0.0;
      for (int c = 0; c < head_dim; ++c) d += static_cast<double>(q[c]) * k[c];
      s[j] = d * scale;
      mx = std::max(mx, s[j]);
    }
    for (double& v : s) sum += (v = std::exp(v - mx));
    for (int c = 0; c < head_dim; ++c) {
      double ref = 0.0;
      for (int j = 0; j < n_kv; ++j) {
        ref += s[j] / sum * vb[j / block_tokens][(j % block_tokens) * stride + g * head_dim + c];
      }
      EXPECT_NEAR(out[c], ref, 1e-5) << "kv head " << g << " dim " << c;
    }
  }
}

TEST(Ops, AddInplace) {
  std::vector<float> y = {1, 2, 3};
  const std::vector<float> x = {0.5f, -2, 10};
  add_inplace(y.data(), x.data(), 3);
  EXPECT_EQ(y, (std::vector<float>{1.5f, 0, 13}));
}

}  // namespace
}  // namespace encore::kernels
