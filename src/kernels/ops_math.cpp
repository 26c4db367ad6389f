// Double-precision exp, log, pow, sin and cos (see ops_math.h). Only exactly
// specified operations are used: + - * /, std::fma, std::nearbyint,
// std::ldexp, std::frexp and std::fmod (IEEE 754 defines each result
// exactly, so they do not depend on the libm version).
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/ops_math.h"

namespace encore::kernels {
namespace {

// ln 2 = kLn2Hi + kLn2Lo; kLn2Hi has 32 significant bits, so k * kLn2Hi is
// exact for |k| < 2^21.
constexpr double kLn2Hi = 0x1.62e42feep-1;
constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
constexpr double kInvLn2 = 0x1.71547652b82fep0;
// pi/2 = kPio2A + kPio2B + kPio2C: kPio2A is pi/2 cut to 33 bits, so for
// |k| < 2^30 fma(-k, kPio2A, x) is exact (the difference is a multiple of
// 2^-32 below 2 in magnitude); B and C are the next two doubles of pi/2.
// Together ~139 bits of pi/2.
constexpr double kPio2A = 0x1.921fb544p0;
constexpr double kPio2B = 0x1.0b4611a626331p-34;
constexpr double kPio2C = 0x1.1701b839a2520p-88;
constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;

constexpr double inv_factorial(int k) {
  double f = 1.0;
  for (int i = 2; i <= k; ++i) f *= i;  // exact: k! < 2^53 * 2^k for k <= 20
  return 1.0 / f;
}

// sin(r) and cos(r) for |r| <= ~pi/4 by Taylor series (truncation < 1e-19).
double sin_poly(double r) {
  const double r2 = r * r;
  double p = -inv_factorial(19);
  p = std::fma(p, r2, inv_factorial(17));
  p = std::fma(p, r2, -inv_factorial(15));
  p = std::fma(p, r2, inv_factorial(13));
  p = std::fma(p, r2, -inv_factorial(11));
  p = std::fma(p, r2, inv_factorial(9));
  p = std::fma(p, r2, -inv_factorial(7));
  p = std::fma(p, r2, inv_factorial(5));
  p = std::fma(p, r2, -inv_factorial(3));
  return std::fma(r * r2, p, r);
}

double cos_poly(double r) {
  const double r2 = r * r;
  double p = inv_factorial(20);
  p = std::fma(p, r2, -inv_factorial(18));
  p = std::fma(p, r2, inv_factorial(16));
  p = std::fma(p, r2, -inv_factorial(14));
  p = std::fma(p, r2, inv_factorial(12));
  p = std::fma(p, r2, -inv_factorial(10));
  p = std::fma(p, r2, inv_factorial(8));
  p = std::fma(p, r2, -inv_factorial(6));
  p = std::fma(p, r2, inv_factorial(4));
  p = std::fma(p, r2, -0.5);
  return std::fma(r2, p, 1.0);
}

// exp(hi + lo) for |lo| << |hi| (lo: the rounding error of a product).
double exp_dd(double hi, double lo) {
  if (hi != hi) return hi + hi;
  if (hi > 709.8) return std::numeric_limits<double>::infinity();
  if (hi < -745.2) return 0.0;
  // hi + lo = k ln2 + r, |r| <= ln2/2 (+ rounding slack).
  const double k = std::nearbyint(hi * kInvLn2);
  double r = std::fma(-k, kLn2Hi, hi);  // exact
  r = std::fma(-k, kLn2Lo, r) + lo;
  // Taylor to r^14/14!: truncation < 1e-18 relative for |r| <= 0.35.
  double p = inv_factorial(14);
  for (int i = 13; i >= 0; --i) p = std::fma(p, r, inv_factorial(i));
  return std::ldexp(p, static_cast<int>(k));
}

// log(x) = hi + lo for finite x > 0: hi = e * ln2_hi (exact), lo = the rest
// (|lo| < 0.36 + |e| 2^-32), so the absolute error is ~1e-17 whatever e is.
void log_dd(double x, double* hi, double* lo) {
  int e = 0;
  double m = std::frexp(x, &e);    // x = m 2^e, m in [0.5, 1)
  if (m < 0x1.6a09e667f3bcdp-1) {  // sqrt(1/2): keep m in [0.707, 1.414)
    m *= 2.0;
    --e;
  }
  // log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716.
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  // 2 atanh(s) = 2 (s + s^3/3 + s^5/5 + ...); up to s^27: truncation < 1e-22.
  double p = 1.0 / 27.0;
  for (int k = 25; k >= 3; k -= 2) p = std::fma(p, s2, 1.0 / k);
  const double log_m = 2.0 * std::fma(s * s2, p, s);
  const double de = static_cast<double>(e);
  *hi = de * kLn2Hi;
  *lo = std::fma(de, kLn2Lo, log_m);
}

}  // namespace

double exp_f64(double x) { return exp_dd(x, 0.0); }

double log_f64(double x) {
  if (x != x || x < 0.0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0.0) return -std::numeric_limits<double>::infinity();
  if (x == std::numeric_limits<double>::infinity()) return x;
  double hi = 0.0, lo = 0.0;
  log_dd(x, &hi, &lo);
  return hi + lo;
}

double pow_f64(double x, double y) {
  if (x == 1.0 || y == 0.0) return 1.0;
  if (!(x > 0.0) || y != y) return std::numeric_limits<double>::quiet_NaN();
  if (x == std::numeric_limits<double>::infinity()) return y > 0.0 ? x : 0.0;
  // y log x as an unevaluated sum: the exact product y * hi split by fma,
  // plus y * lo. Keeps the relative error of the result near 1e-16 even when
  // |y log x| is large.
  double hi = 0.0, lo = 0.0;
  log_dd(x, &hi, &lo);
  const double p_hi = y * hi;
  const double p_err = std::fma(y, hi, -p_hi);
  const double p_lo = std::fma(y, lo, p_err);
  const double t_hi = p_hi + p_lo;
  const double t_lo = p_lo - (t_hi - p_hi);  // Fast2Sum (|p_hi| >= |p_lo| or p_hi = 0)
  return exp_dd(t_hi, t_lo);
}

void sincos_f64(double x, double* s, double* c) {
  if (x != x || std::fabs(x) == std::numeric_limits<double>::infinity()) {
    *s = *c = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  // x = k pi/2 + r, |r| <= pi/4 (+ rounding slack).
  const double k = std::nearbyint(x * kTwoOverPi);
  double r = std::fma(-k, kPio2A, x);
  r = std::fma(-k, kPio2B, r);
  r = std::fma(-k, kPio2C, r);
  const int q = (static_cast<int>(std::fmod(k, 4.0)) + 4) & 3;  // quadrant
  const double sr = sin_poly(r), cr = cos_poly(r);
  switch (q) {
    case 0:
      *s = sr;
      *c = cr;
      break;
    case 1:
      *s = cr;
      *c = -sr;
      break;
    case 2:
      *s = -sr;
      *c = -cr;
      break;
    default:
      *s = -cr;
      *c = sr;
      break;
  }
}

}  // namespace encore::kernels
