// Kernels of kernels/ops.h: every SIMD version bit-identical to its scalar
// twin (memcmp) on many sizes and tails, plus accuracy against double
// precision references (exp, sin, cos, pow, rmsnorm, RoPE, attention).
#include "kernels/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/fp16.h"
#include "kernels/ops_math.h"
#include "kernels/ops_simd.h"

namespace encore::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_vec(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// The SIMD ISAs this CPU can run (the scalar twin is the reference).
std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (Isa isa : supported_isas()) {
    if (isa != Isa::Scalar) out.push_back(isa);
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// |got - ref| in units of the float ulp at ref (subnormal spacing below 2^-126).
double ulp_error(float got, double ref) {
  if (std::isinf(ref) || std::fabs(ref) > std::numeric_limits<float>::max()) {
    return std::isinf(got) && (got > 0) == (ref > 0) ? 0.0 : 1e9;
  }
  int e = 0;
  std::frexp(ref, &e);  // |ref| in [2^(e-1), 2^e)
  const double ulp = std::ldexp(1.0, std::max(e - 24, -149));
  return std::fabs(static_cast<double>(got) - ref) / ulp;
}

// ---------------------------------------------------------------- exp

TEST(OpsExp, WithinTwoUlpOfDoubleOverTheWholeRange) {
  // Every 64th float in [-104, 89] (both signs; ~35M values).
  double max_err = 0.0;
  float worst = 0.0f;
  int64_t n = 0, not_rounded_correctly = 0;
  auto check = [&](float x) {
    const double ref = std::exp(static_cast<double>(x));
    const float got = exp_f32(x);
    const double err = ulp_error(got, ref);
    if (got != static_cast<float>(ref)) ++not_rounded_correctly;
    if (err > max_err) {
      max_err = err;
      worst = x;
    }
    ++n;
  };
  for (uint32_t b = 0; b <= std::bit_cast<uint32_t>(89.0f); b += 64) check(std::bit_cast<float>(b));
  for (uint32_t b = 0x80000000u; b <= std::bit_cast<uint32_t>(-104.0f); b += 64) {
    check(std::bit_cast<float>(b));
  }
  std::printf(
      "exp_f32: %lld values, max error %.3f ulp (at %a), %lld (%.4f%%) not correctly "
      "rounded\n",
      static_cast<long long>(n), max_err, worst, static_cast<long long>(not_rounded_correctly),
      100.0 * static_cast<double>(not_rounded_correctly) / static_cast<double>(n));
  EXPECT_LE(max_err, 2.0) << "at x = " << worst;
}

TEST(OpsExp, SpecialValues) {
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  EXPECT_EQ(exp_f32(kInf), kInf);
  EXPECT_EQ(exp_f32(-kInf), 0.0f);
  EXPECT_FALSE(std::signbit(exp_f32(-kInf)));
  EXPECT_TRUE(std::isnan(exp_f32(kNaN)));
  EXPECT_EQ(exp_f32(89.0f), kInf);
  EXPECT_EQ(exp_f32(1e30f), kInf);
  EXPECT_LE(ulp_error(exp_f32(88.7f), std::exp(double{88.7f})), 1.0);
  EXPECT_EQ(exp_f32(-104.0f), 0.0f);
  EXPECT_EQ(exp_f32(-1e30f), 0.0f);
  // Largest finite result and the overflow boundary: exp(88.72283935546875)
  // is just below FLT_MAX; the next float up overflows.
  EXPECT_TRUE(std::isfinite(exp_f32(88.72283172607421875f)));
  EXPECT_EQ(exp_f32(88.7228393554687500f + 0.0001f), kInf);
  // Subnormal results: within one subnormal step.
  for (float x : {-87.5f, -90.0f, -95.5f, -100.0f, -103.0f, -103.9f}) {
    EXPECT_LE(ulp_error(exp_f32(x), std::exp(static_cast<double>(x))), 1.0) << x;
  }
}

// x values that exercise every path: specials, clamps, overflow and
// underflow boundaries, plus a coarse sweep and random bit patterns.
std::vector<float> exp_test_inputs() {
  std::vector<float> xs = {0.0f,
                           -0.0f,
                           kInf,
                           -kInf,
                           kNaN,
                           -kNaN,
                           1.0f,
                           -1.0f,
                           std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           std::bit_cast<float>(0x7f800001u) /* signalling NaN */};
  auto dense = [&](float lo, float hi) {
    for (float x = lo; x <= hi; x = std::nextafter(x, kInf)) xs.push_back(x);
  };
  dense(88.70f, 88.75f);     // overflow boundary
  dense(-87.35f, -87.30f);   // results turn subnormal
  dense(-104.0f, -103.95f);  // results underflow to 0
  dense(0.34f, 0.35f);       // |r| near ln2/2: n switches
  for (uint32_t b = 0; b < 0x80000000u; b += 997) {
    xs.push_back(std::bit_cast<float>(b));
    xs.push_back(std::bit_cast<float>(b | 0x80000000u));
  }
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-110.0f, 95.0f);
  for (int i = 0; i < 200000; ++i) xs.push_back(u(rng));
  return xs;
}

TEST(OpsExp, SimdBitIdentical) {
  const std::vector<float> xs = exp_test_inputs();
  std::vector<float> ref(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) ref[i] = exp_f32(xs[i]);
  for (Isa isa : simd_isas()) {
    std::vector<float> got(xs.size());
    if (isa == Isa::Avx2 || isa == Isa::AvxVnni)
      avx2::exp_n(xs.data(), got.data(), static_cast<int64_t>(xs.size()));
    if (isa == Isa::Avx512) avx512::exp_n(xs.data(), got.data(), static_cast<int64_t>(xs.size()));
    size_t bad = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
      const bool same = std::memcmp(&got[i], &ref[i], sizeof(float)) == 0 ||
                        (std::isnan(got[i]) && std::isnan(ref[i]));
      if (!same && bad++ < 5) {
        ADD_FAILURE() << isa_name(isa) << " x=" << xs[i] << " got " << got[i] << " want " << ref[i];
      }
    }
    EXPECT_EQ(bad, 0u) << isa_name(isa);
  }
}

// ------------------------------------------------------- silu, swiglu

TEST(OpsSwiglu, MatchesDoubleAndSpecialValues) {
  const std::vector<float> g = random_vec(1000, 8, 4.0f), u = random_vec(1000, 9);
  std::vector<float> out(1000);
  swiglu(out.data(), g.data(), u.data(), 1000, Isa::Scalar);
  for (int i = 0; i < 1000; ++i) {
    const double ref = g[i] / (1.0 + std::exp(-static_cast<double>(g[i]))) * u[i];
    EXPECT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-30);
  }
  EXPECT_EQ(silu(0.0f), 0.0f);
  EXPECT_EQ(silu(kInf), kInf);
  EXPECT_EQ(silu(-200.0f), -0.0f);
  EXPECT_TRUE(std::isnan(silu(kNaN)));
}

TEST(OpsSwiglu, SimdBitIdenticalAllSizes) {
  std::vector<float> g = random_vec(1100, 10, 6.0f);
  const std::vector<float> u = random_vec(1100, 11);
  g[3] = kInf, g[5] = -kInf, g[7] = kNaN, g[9] = 100.0f, g[11] = -100.0f, g[13] = -0.0f;
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 1031}) {
    std::vector<float> ref(static_cast<size_t>(n));
    swiglu(ref.data(), g.data(), u.data(), n, Isa::Scalar);
    for (Isa isa : simd_isas()) {
      std::vector<float> got(static_cast<size_t>(n));
      swiglu(got.data(), g.data(), u.data(), n, isa);
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(ref[i])) {
          EXPECT_TRUE(std::isnan(got[i]));
        } else {
          EXPECT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(ref[i]))
              << isa_name(isa) << " n=" << n << " i=" << i;
        }
      }
      // In place (out aliases gate).
      std::vector<float> inplace(g.begin(), g.begin() + n);
      swiglu(inplace.data(), inplace.data(), u.data(), n, isa);
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isnan(ref[i])) {
          EXPECT_EQ(inplace[i], ref[i]);
        }
      }
    }
  }
}

// -------------------------------------------------------------- rmsnorm

TEST(OpsRmsNorm, MatchesDoubleAndSimdBitIdentical) {
  for (int64_t n : {1, 2, 7, 15, 16, 17, 31, 32, 33, 100, 173, 288, 4096, 4097}) {
    const std::vector<float> x = random_vec(static_cast<size_t>(n), 1 + n, 3.0f);
    const std::vector<float> w = random_vec(static_cast<size_t>(n), 2 + n);
    std::vector<float> ref(static_cast<size_t>(n));
    rmsnorm(ref.data(), x.data(), w.data(), n, 1e-5f, Isa::Scalar);
    double ss = 0.0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + 1e-5);
    for (int64_t i = 0; i < n; ++i) {
      const double r = x[i] * scale * w[i];
      EXPECT_NEAR(ref[i], r, 1e-5 * std::fabs(r) + 1e-7) << "n=" << n;
    }
    for (Isa isa : simd_isas()) {
      std::vector<float> got(static_cast<size_t>(n));
      rmsnorm(got.data(), x.data(), w.data(), n, 1e-5f, isa);
      EXPECT_TRUE(same_bits(got, ref)) << isa_name(isa) << " n=" << n;
      std::vector<float> inplace = x;  // out aliases x
      rmsnorm(inplace.data(), inplace.data(), w.data(), n, 1e-5f, isa);
      EXPECT_TRUE(same_bits(inplace, ref)) << isa_name(isa) << " in place, n=" << n;
    }
  }
}

// ------------------------------------------------------ pow, sin, cos

TEST(OpsMath, SinCosWithinOneUlpOfCorrectlyRounded) {
  std::mt19937 rng(5);
  int64_t n = 0, mismatches = 0;
  double max_err = 0.0;
  auto check = [&](float x) {
    double s = 0.0, c = 0.0;
    sincos_f64(x, &s, &c);
    const double rs = std::sin(static_cast<double>(x)), rc = std::cos(static_cast<double>(x));
    mismatches += (static_cast<float>(s) != static_cast<float>(rs)) +
                  (static_cast<float>(c) != static_cast<float>(rc));
    max_err = std::max(
        {max_err, ulp_error(static_cast<float>(s), rs), ulp_error(static_cast<float>(c), rc)});
    EXPECT_NEAR(s, rs, 1e-15 + 1e-15 * std::fabs(x) * 1e-3) << x;
    n += 2;
  };
  std::uniform_real_distribution<float> small(-10.0f, 10.0f), mid(-1e4f, 1e4f), big(-2e6f, 2e6f);
  for (int i = 0; i < 300000; ++i) {
    check(small(rng));
    check(mid(rng));
    check(big(rng));
  }
  // Integer positions times typical RoPE frequencies, and exact multiples
  // near k * pi / 2.
  for (int64_t pos = 0; pos < 40000; pos += 7) {
    float t = static_cast<float>(pos);
    for (int i = 0; i < 64; ++i, t *= 0.8659643f) check(t);
  }
  for (int k = -2000; k <= 2000; ++k) {
    const float x = static_cast<float>(k * M_PI / 2);
    check(x), check(std::nextafter(x, kInf)), check(std::nextafter(x, -kInf));
  }
  std::printf(
      "sin/cos (double, rounded to float): %lld values, %lld differ from the correctly "
      "rounded float, max %.3f ulp\n",
      static_cast<long long>(n), static_cast<long long>(mismatches), max_err);
  EXPECT_LE(max_err, 1.0);
  EXPECT_LE(mismatches, n / 100000);
  double s = 0.0, c = 0.0;
  sincos_f64(0.0, &s, &c);
  EXPECT_EQ(s, 0.0);
  EXPECT_EQ(c, 1.0);
  sincos_f64(INFINITY, &s, &c);
  EXPECT_TRUE(std::isnan(s) && std::isnan(c));
}

TEST(OpsMath, PowIsCorrectlyRoundedForRopeBases) {
  // theta_scale = base^(-2/n_rot) in float. glibc's powf is not always
  // correctly rounded (0.5003 ulp cases exist); ours matches the double
  // reference rounded to float.
  int64_t n = 0, mismatches = 0, libm_differs = 0;
  for (float base : {10000.0f, 500000.0f, 1000000.0f, 10000000.0f, 2.0f, 1.5f, 0.5f, 123.456f}) {
    for (int n_rot = 2; n_rot <= 512; n_rot += 2) {
      const float e = -2.0f / static_cast<float>(n_rot);
      const double got = pow_f64(base, e);
      const double ref = std::pow(static_cast<double>(base), static_cast<double>(e));
      EXPECT_NEAR(got, ref, 3e-16 * ref) << base << "^" << e;
      mismatches += static_cast<float>(got) != static_cast<float>(ref);
      libm_differs += static_cast<float>(got) != std::pow(base, e);
      ++n;
    }
  }
  std::printf(
      "pow: %lld RoPE theta_scale values, %lld differ from double pow rounded to float, "
      "%lld from libm powf\n",
      static_cast<long long>(n), static_cast<long long>(mismatches),
      static_cast<long long>(libm_differs));
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(static_cast<float>(pow_f64(10000.0, -0.25)),
            std::pow(10000.0f, -0.25f));  // stories260K
}

TEST(OpsMath, ExpLogMatchDouble) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-700.0, 700.0);
  for (int i = 0; i < 100000; ++i) {
    const double x = u(rng);
    EXPECT_NEAR(exp_f64(x), std::exp(x), 4e-16 * std::exp(x));
    const double y = std::exp(x / 2);
    EXPECT_NEAR(log_f64(y), std::log(y), 3e-16 * std::fabs(std::log(y)) + 1e-300);
  }
  EXPECT_EQ(pow_f64(1.0, 5.0), 1.0);
  EXPECT_TRUE(std::isnan(pow_f64(-1.0, 0.5)));
  EXPECT_EQ(exp_f64(0.0), 1.0);
  EXPECT_EQ(log_f64(1.0), 0.0);
}

// ---------------------------------------------------------------- rope

// ggml's angle recurrence in float with libm-free double cos/sin replaced by
// the double std:: functions (the values a correctly rounded libm gives).
void rope_reference(int64_t pos, int n_rot, float base, float freq_scale, const float* ff, float* c,
                    float* s) {
  const float theta_scale = static_cast<float>(std::pow(double{base}, -2.0f / n_rot));
  float t = static_cast<float>(pos);
  for (int i = 0; i < n_rot / 2; ++i) {
    const float theta = freq_scale * (t / (ff != nullptr ? ff[i] : 1.0f));
    c[i] = static_cast<float>(std::cos(static_cast<double>(theta)));
    s[i] = static_cast<float>(std::sin(static_cast<double>(theta)));
    t *= theta_scale;
  }
}

TEST(OpsRope, CosSinFollowGgml) {
  int64_t n = 0, mismatches = 0;
  std::vector<float> factors(64);
  for (int i = 0; i < 64; ++i) factors[i] = 1.0f + 0.37f * static_cast<float>(i % 7);
  for (int n_rot : {8, 64, 128}) {
    for (float scale : {1.0f, 0.25f, 0.125f}) {
      for (bool use_ff : {false, true}) {
        for (int64_t pos : {0, 1, 2, 7, 100, 4095, 32767, 131071, 1000000}) {
          std::vector<float> c(n_rot / 2), s(n_rot / 2), rc(n_rot / 2), rs(n_rot / 2);
          const float* ff = use_ff ? factors.data() : nullptr;
          rope_cos_sin(pos, n_rot, 10000.0f, scale, ff, c.data(), s.data());
          rope_reference(pos, n_rot, 10000.0f, scale, ff, rc.data(), rs.data());
          for (int i = 0; i < n_rot / 2; ++i) {
            mismatches += (c[i] != rc[i]) + (s[i] != rs[i]);
            EXPECT_LE(std::fabs(c[i] - rc[i]), std::ldexp(1.0f, -24)) << pos << " " << i;
            EXPECT_LE(std::fabs(s[i] - rs[i]), std::ldexp(1.0f, -24)) << pos << " " << i;
            n += 2;
          }
          if (pos == 0) {
            for (int i = 0; i < n_rot / 2; ++i) {
              EXPECT_EQ(c[i], 1.0f);
              EXPECT_EQ(s[i], 0.0f);
            }
          }
        }
      }
    }
  }
  std::printf("rope_cos_sin: %lld values, %lld differ from the correctly rounded reference\n",
              static_cast<long long>(n), static_cast<long long>(mismatches));
  EXPECT_EQ(mismatches, 0);
}

// Double-precision rotation of pair (a, b) by pos * base^(-2i/n_rot).
void rotate_ref(double* a, double* b, int64_t pos, int i, int n_rot, double base) {
  const double theta = static_cast<double>(pos) * std::pow(base, -2.0 * i / n_rot);
  const double x0 = *a, x1 = *b;
  *a = x0 * std::cos(theta) - x1 * std::sin(theta);
  *b = x0 * std::sin(theta) + x1 * std::cos(theta);
}

TEST(OpsRope, AdjacentAndNeoxMatchDouble) {
  const int n_heads = 3, head_dim = 16, n_rot = 12, half = n_rot / 2;
  const float base = 10000.0f;
  for (int64_t pos : {0, 1, 7, 100}) {
    std::vector<float> cs(half), sn(half);
    rope_cos_sin(pos, n_rot, base, 1.0f, nullptr, cs.data(), sn.data());
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
        if (j % head_dim >= n_rot || pos == 0) {
          EXPECT_EQ(got[j], x[j]);  // untouched dims
        }
      }
    }
  }
}

TEST(Ops, AddInplace) {
  std::vector<float> y = {1, 2, 3};
  const std::vector<float> x = {0.5f, -2, 10};
  add_inplace(y.data(), x.data(), 3);
  EXPECT_EQ(y, (std::vector<float>{1.5f, 0, 13}));
}

// ----------------------------------------------------------- attention

// A paged KV cache with its blocks in shuffled memory order, plus the exact
// float value of every element (after F16 rounding).
struct TestKv {
  std::vector<uint8_t> k_store, v_store;  // [n_blocks, block_tokens, row_stride] elements
  std::vector<const uint8_t*> k_blocks, v_blocks;
  std::vector<float> k, v;  // [n_kv, row_stride] exact values
  PagedKv kv;
};

TestKv make_kv(DType type, int64_t n_kv, int n_kv_heads, int head_dim, int64_t block_tokens,
               uint32_t seed, float k_scale = 1.0f) {
  TestKv t;
  const int64_t stride = static_cast<int64_t>(n_kv_heads) * head_dim;
  const int64_t n_blocks = (n_kv + block_tokens - 1) / block_tokens;
  const size_t elem = type == DType::F16 ? 2 : 4;
  const size_t block_bytes = static_cast<size_t>(block_tokens * stride) * elem;
  t.k_store.assign(static_cast<size_t>(n_blocks) * block_bytes, 0);
  t.v_store.assign(t.k_store.size(), 0);
  std::vector<int64_t> order(static_cast<size_t>(n_blocks));
  for (int64_t b = 0; b < n_blocks; ++b) order[b] = b;
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  for (int64_t b : order) {
    t.k_blocks.push_back(t.k_store.data() + b * block_bytes);
    t.v_blocks.push_back(t.v_store.data() + b * block_bytes);
  }
  t.k = random_vec(static_cast<size_t>(n_kv * stride), seed + 1, k_scale);
  t.v = random_vec(static_cast<size_t>(n_kv * stride), seed + 2);
  for (int64_t j = 0; j < n_kv; ++j) {
    for (int64_t e = 0; e < stride; ++e) {
      const size_t at = static_cast<size_t>((j % block_tokens) * stride + e) * elem;
      float& kx = t.k[j * stride + e];
      float& vx = t.v[j * stride + e];
      uint8_t* kd = const_cast<uint8_t*>(t.k_blocks[j / block_tokens]) + at;
      uint8_t* vd = const_cast<uint8_t*>(t.v_blocks[j / block_tokens]) + at;
      if (type == DType::F16) {
        const uint16_t kh = f32_to_fp16(kx), vh = f32_to_fp16(vx);
        kx = fp16_to_f32(kh), vx = fp16_to_f32(vh);
        std::memcpy(kd, &kh, 2), std::memcpy(vd, &vh, 2);
      } else {
        std::memcpy(kd, &kx, 4), std::memcpy(vd, &vx, 4);
      }
    }
  }
  t.kv = PagedKv{t.k_blocks.data(), t.v_blocks.data(), type, block_tokens, stride};
  return t;
}

// Softmax attention in double precision for query head q against KV head g.
std::vector<double> attention_double(const float* q, const TestKv& t, int g, int64_t n_kv,
                                     int head_dim, float scale) {
  const int64_t stride = t.kv.row_stride;
  std::vector<double> s(static_cast<size_t>(n_kv)), out(static_cast<size_t>(head_dim), 0.0);
  double mx = -INFINITY, sum = 0.0;
  for (int64_t j = 0; j < n_kv; ++j) {
    double d = 0.0;
    for (int c = 0; c < head_dim; ++c)
      d += static_cast<double>(q[c]) * t.k[j * stride + g * head_dim + c];
    s[j] = d * scale;
    mx = std::max(mx, s[j]);
  }
  for (double& x : s) sum += (x = std::exp(x - mx));
  for (int64_t j = 0; j < n_kv; ++j) {
    for (int c = 0; c < head_dim; ++c) out[c] += s[j] / sum * t.v[j * stride + g * head_dim + c];
  }
  return out;
}

// attention_gqa on `isa` against the scalar attention_head, head by head:
// outputs and the scores scratch (left holding p) must match bit for bit.
void expect_attention_identical(const TestKv& t, const std::vector<float>& q, int n_q_heads, int g,
                                int64_t n_kv, int head_dim, float scale, const std::string& what) {
  const size_t n_out = static_cast<size_t>(n_q_heads) * head_dim;
  const size_t n_s = static_cast<size_t>(n_q_heads * n_kv);
  std::vector<float> ref(n_out), ref_s(n_s);
  for (int h = 0; h < n_q_heads; ++h) {
    attention_head(q.data() + h * head_dim, t.kv, g, n_kv, head_dim, scale, ref_s.data() + h * n_kv,
                   ref.data() + h * head_dim, Isa::Scalar);
  }
  for (Isa isa : supported_isas()) {
    std::vector<float> out(n_out), sc(n_s);
    attention_gqa(q.data(), n_q_heads, t.kv, g, n_kv, head_dim, scale, sc.data(), out.data(), isa);
    EXPECT_TRUE(same_bits(out, ref)) << what << " " << isa_name(isa);
    EXPECT_TRUE(same_bits(sc, ref_s)) << what << " scores " << isa_name(isa);
    std::vector<float> one(static_cast<size_t>(head_dim)), one_s(static_cast<size_t>(n_kv));
    attention_head(q.data(), t.kv, g, n_kv, head_dim, scale, one_s.data(), one.data(), isa);
    EXPECT_EQ(0, std::memcmp(one.data(), ref.data(), one.size() * sizeof(float)))
        << what << " attention_head " << isa_name(isa);
  }
}

TEST(OpsAttention, SimdBitIdenticalToScalarAndCloseToDouble) {
  int configs = 0;
  for (int head_dim : {1, 8, 17, 64, 80, 128}) {
    for (int64_t n_kv : {1, 2, 15, 16, 17, 100, 300}) {
      for (DType type : {DType::F32, DType::F16}) {
        for (int64_t block_tokens : {4, 16}) {
          for (int group : {1, 4, 8}) {
            const int n_kv_heads = 2;
            const uint32_t seed = static_cast<uint32_t>(head_dim * 1000 + n_kv * 10 + group);
            const TestKv t = make_kv(type, n_kv, n_kv_heads, head_dim, block_tokens, seed);
            const std::vector<float> q =
                random_vec(static_cast<size_t>(group * head_dim), seed + 7);
            const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
            const std::string what = "head_dim " + std::to_string(head_dim) + " n_kv " +
                                     std::to_string(n_kv) + " " + dtype_name(type) + " block " +
                                     std::to_string(block_tokens) + " group " +
                                     std::to_string(group);
            for (int g = 0; g < n_kv_heads; ++g) {
              expect_attention_identical(t, q, group, g, n_kv, head_dim, scale, what);
            }
            std::vector<float> out(static_cast<size_t>(head_dim)), sc(static_cast<size_t>(n_kv));
            attention_head(q.data(), t.kv, 1, n_kv, head_dim, scale, sc.data(), out.data(),
                           Isa::Scalar);
            const std::vector<double> ref = attention_double(q.data(), t, 1, n_kv, head_dim, scale);
            for (int c = 0; c < head_dim; ++c) EXPECT_NEAR(out[c], ref[c], 2e-6) << what;
            ++configs;
          }
        }
      }
    }
  }
  EXPECT_EQ(configs, 6 * 7 * 2 * 2 * 3);
}

TEST(OpsAttention, LongContextsPeakyScoresAndChunkBoundaries) {
  // Large score spreads (most p_j underflow to 0), many chunks of the SIMD
  // driver, F16 chunks of every size.
  for (int head_dim : {8, 64, 128, 256, 300}) {
    for (DType type : {DType::F32, DType::F16}) {
      const int64_t n_kv = 1037;
      const TestKv t = make_kv(type, n_kv, 1, head_dim, 16, 77 + head_dim, 4.0f);
      const std::vector<float> q = random_vec(static_cast<size_t>(4 * head_dim), 78, 3.0f);
      const std::string what = "head_dim " + std::to_string(head_dim) + " " + dtype_name(type);
      expect_attention_identical(t, q, 4, 0, n_kv, head_dim, 1.0f, what);
    }
  }
}

// attention_tokens: several query tokens of one sequence at once (a prefill
// chunk), each with its own visible row count, against the scalar
// attention_head token by token and head by head, on every ISA (the scalar
// table too). Rows past a token's count must not reach it: the counts
// differ by token and cut chunks mid-way, and a token with 0 rows gets zeros
// beside tokens that see rows.
TEST(OpsAttention, TokensOfAChunkEachSeeTheirOwnRows) {
  int configs = 0;
  for (int head_dim : {8, 17, 64, 80, 128}) {
    for (DType type : {DType::F32, DType::F16}) {
      for (int group : {1, 3, 4, 6, 8}) {  // 6: a 4-head tile, then 2 heads one at a time
        const int64_t n_all = 300;
        const int n_kv_heads = 2, g = 1;
        const uint32_t seed = static_cast<uint32_t>(head_dim * 100 + group);
        const TestKv t = make_kv(type, n_all, n_kv_heads, head_dim, 16, seed);
        // Causal prefill counts, then counts that skip around: 0, past a
        // chunk edge (128), the last row.
        const std::vector<int64_t> n_kv = {281, 282, 283, 284, 285, 0, 1, 129, 127, 300, 17};
        const int n_tok = static_cast<int>(n_kv.size());
        const int64_t qs = int64_t{group} * head_dim + 5;  // heads of a token, then a gap
        const std::vector<float> q = random_vec(static_cast<size_t>(n_tok * qs), seed + 9);
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        std::vector<float> ref(q.size(), 0.0f);
        for (int i = 0; i < n_tok; ++i) {
          for (int h = 0; h < group; ++h) {
            std::vector<float> sc(static_cast<size_t>(std::max<int64_t>(1, n_kv[i])));
            attention_head(q.data() + i * qs + h * head_dim, t.kv, g, n_kv[i], head_dim, scale,
                           sc.data(), ref.data() + i * qs + h * head_dim, Isa::Scalar);
          }
        }
        for (Isa isa : supported_isas()) {
          std::vector<float> out(q.size(), 0.0f);
          std::vector<float> sc(static_cast<size_t>(n_tok * group * n_all));
          attention_tokens(q.data(), qs, n_tok, n_kv.data(), group, t.kv, g, head_dim, scale,
                           sc.data(), out.data(), isa);
          for (int i = 0; i < n_tok; ++i) {
            for (int h = 0; h < group; ++h) {
              const float* o = out.data() + i * qs + h * head_dim;
              const float* r = ref.data() + i * qs + h * head_dim;
              EXPECT_EQ(0, std::memcmp(o, r, sizeof(float) * static_cast<size_t>(head_dim)))
                  << "head_dim " << head_dim << " " << dtype_name(type) << " group " << group
                  << " token " << i << " (" << n_kv[i] << " rows) head " << h << " "
                  << isa_name(isa);
            }
          }
          // Nothing written between tokens (the gap of q_stride) either.
          EXPECT_TRUE(same_bits(out, ref)) << "head_dim " << head_dim << " " << isa_name(isa);
        }
        // A token that sees one row more gets a different output: the
        // counts are honoured, not just the largest.
        std::vector<float> one(static_cast<size_t>(qs)), sc(static_cast<size_t>(group * n_all));
        const int64_t more = n_kv[0] + 1;
        attention_tokens(q.data(), qs, 1, &more, group, t.kv, g, head_dim, scale, sc.data(),
                         one.data(), supported_isas().back());
        EXPECT_NE(0, std::memcmp(one.data(), ref.data(), sizeof(float) * head_dim));
        ++configs;
      }
    }
  }
  EXPECT_EQ(configs, 5 * 2 * 5);
}

TEST(OpsAttention, EdgeCases) {
  const int head_dim = 64;
  const TestKv t = make_kv(DType::F32, 40, 1, head_dim, 16, 5);
  std::vector<float> q = random_vec(2 * head_dim, 6);
  // NaN in q: NaN out (no crash) on every ISA, for that head only.
  q[3] = kNaN;
  for (Isa isa : supported_isas()) {
    std::vector<float> out(2 * head_dim), sc(2 * 40);
    attention_gqa(q.data(), 2, t.kv, 0, 40, head_dim, 0.125f, sc.data(), out.data(), isa);
    for (int c = 0; c < head_dim; ++c) {
      EXPECT_TRUE(std::isnan(out[c])) << isa_name(isa);
      EXPECT_FALSE(std::isnan(out[head_dim + c])) << isa_name(isa);
    }
  }
  // Infinite and huge scores behave the same everywhere.
  q = random_vec(2 * head_dim, 7, 1e20f);
  expect_attention_identical(t, q, 2, 0, 40, head_dim, 1e20f, "huge scores");
  // No tokens: zeros.
  std::vector<float> out(head_dim, 1.0f);
  attention_head(q.data(), t.kv, 0, 0, head_dim, 1.0f, nullptr, out.data(), Isa::Scalar);
  EXPECT_EQ(out, std::vector<float>(head_dim, 0.0f));
}

}  // namespace
}  // namespace encore::kernels
