// Matrix multiplication driver (see matmul.h): picks the kernel table for the
// ISA, quantises the activations once per call, splits the output rows across
// threads and walks them in cache-sized blocks of row panels (panel.h for
// the quantised types, float_panel.h for F32/F16/BF16). The arithmetic (and its canonical
// order) lives in matmul_internal.h and the matmul_{scalar,avx2,avx512}.cpp
// and matmul_panel_*.cpp tables; nothing here touches a sum, so the blocking
// and the thread split never change a bit of the result.
#include "kernels/matmul.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "encore/thread_pool.h"
#include "kernels/canonical.h"
#include "kernels/float_panel.h"
#include "kernels/kernel_table.h"
#include "kernels/matmul_internal.h"
#include "kernels/panel.h"
#include "kernels/quants.h"

namespace encore::kernels {
namespace {

using mm::ActRows;
using mm::IsaKernels;

// Every NaN leaves as the one quiet NaN (see matmul_internal.h).
inline float canon(float v) { return std::isnan(v) ? std::bit_cast<float>(mm::kCanonNanBits) : v; }

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// The first 64-byte aligned float of a buffer allocated 16 floats longer.
float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

// n elements of v; grows without copying the old contents (no call reads
// them).
template <class T>
T* grow(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) {
    std::vector<T>().swap(v);
    v.resize(static_cast<size_t>(n));
  }
  return v.data();
}

// Panels per block: a block's panels (a few KiB to ~100 KiB) stay in L2
// while every chunk of activation rows passes over them, and a chunk of
// kMaxTileC activation rows (K bytes each) stays in L1 across the block's
// panels. Only speed depends on it.
int64_t panels_per_block(int64_t m) { return m <= mm::kDecodeRows ? 1 : 4; }

// Beyond decode-sized batches threads take a matrix's panels in this many
// chunks each, claiming the next free one when done (ThreadPool::
// parallel_for), so a core that is slowed down (the server's threads,
// another process) leaves its remaining chunks to the others instead of
// holding up the step: `encore serve`, 32 clients, 1b Q8_0, 2 threads, best
// of 2 alternated 40 s rounds: 236 vs 220 generated tok/s. Decode-sized
// batches keep one contiguous range per thread (one stream from DRAM each;
// 4 chunks measured no faster there). Only speed depends on it.
constexpr int kChunksPerThread = 4;

// run(p_begin, p_end, thread) over [0, n_panels) on the pool (in chunks
// beyond decode-sized batches of m rows), or on the caller for small work.
void run_panels(int64_t n_panels, int64_t work, int64_t m, ThreadPool* pool,
                const ThreadPool::RangeFn& run) {
  if (pool == nullptr || pool->size() == 1 || work < kMinParallelWork) {
    run(0, n_panels, 0);
  } else {
    pool->parallel_for(n_panels, run, m <= mm::kDecodeRows ? 1 : kChunksPerThread);
  }
}

void matmul_int(const WeightView& w, const float* x, float* y, int64_t m, ThreadPool* pool,
                const IsaKernels& kt, MatmulScratch& s) {
  const int64_t rows = w.rows, cols = w.cols;
  const int64_t kp = mm::padded_k(cols);
  const int64_t n_groups = kp / mm::kGroup, k_groups = cols / mm::kGroup;

  // Quantised activations, zero-padded to kp (quantize_act writes only the
  // first cols values and groups of a row; the kernels read only cols).
  int8_t* const act_q = grow(s.act_q, m * kp);           // [m, kp]
  float* const act_f = grow(s.act_f, 2 * m * n_groups);  // [2][m, n_groups]
  int32_t* const act_i = grow(s.act_i, m * kp / 16);     // [m, kp / 16]
  const ActRows act{act_q, act_f, act_f + m * n_groups, act_i, kp};
  for (int64_t i = 0; i < m; ++i) {
    kt.quantize_act(x + i * cols, cols, act, i);
    std::fill(act_q + i * kp + cols, act_q + (i + 1) * kp, int8_t{0});
    std::fill(act.d + i * n_groups + k_groups, act.d + (i + 1) * n_groups, 0.0f);
    std::fill(act.asum + i * n_groups + k_groups, act.asum + (i + 1) * n_groups, 0.0f);
    for (int64_t h = 0; h < kp / 16; ++h) {
      const int8_t* qh = act_q + i * kp + 16 * h;
      int32_t sum = 0;
      for (int k = 0; k < 16; ++k) sum += qh[k];
      act_i[i * (kp / 16) + h] = sum;
    }
  }

  const int64_t n_panels = mm::panel_count(rows);
  const size_t pbytes = mm::panel_bytes(w.type, cols);
  const int64_t per_block = panels_per_block(m);
  auto run = [&](int64_t p_begin, int64_t p_end, int thread) {
    // Views without repacked panels (tests, tools) are repacked a block at a
    // time into this thread's buffer: the same numbers, so the same bits.
    uint8_t* const own = w.panels == nullptr ? grow(s.threads[thread].panels,
                                                    per_block * static_cast<int64_t>(pbytes))
                                             : nullptr;
    float out[mm::kMaxTileC * mm::kPanelRows];  // [C][16] a tile's outputs
    for (int64_t pb = p_begin; pb < p_end; pb += per_block) {
      const int64_t np = std::min(per_block, p_end - pb);
      const uint8_t* base;
      if (own != nullptr) {
        for (int64_t p = 0; p < np; ++p) mm::repack_panel(w, pb + p, own + p * pbytes);
        base = own;
      } else {
        base = w.panels + static_cast<size_t>(pb) * pbytes;
      }
      for (int64_t i0 = 0; i0 < m; i0 += mm::kMaxTileC) {
        const int C = static_cast<int>(std::min<int64_t>(mm::kMaxTileC, m - i0));
        for (int64_t p = 0; p < np; ++p) {
          kt.panel_tile(w.type, base + static_cast<size_t>(p) * pbytes, cols, act, i0, C, out);
          const int64_t r0 = (pb + p) * mm::kPanelRows;
          const int R = static_cast<int>(std::min<int64_t>(mm::kPanelRows, rows - r0));
          for (int c = 0; c < C; ++c) {
            for (int r = 0; r < R; ++r) {
              y[(i0 + c) * rows + r0 + r] = canon(out[c * mm::kPanelRows + r]);
            }
          }
        }
      }
    }
  };
  run_panels(n_panels, rows * cols * m, m, pool, run);
}

// n floats of v, 64-byte aligned.
float* grow_aligned(std::vector<float>& v, int64_t n) { return align64(grow(v, n + kDotLanes)); }

// The float path walks a thread's panels in blocks of about this many bytes
// (they stay in L2 while every chunk of activation rows passes over them),
// and the activations in chunks of kFloatChunk rows (a kernel tile's rows
// stay in L1/L2 across the block's panels). Only speed depends on them.
constexpr size_t kFloatBlockBytes = size_t{256} << 10;
constexpr int64_t kFloatChunk = 48;
static_assert(kFloatChunk % mm::kActGroup == 0, "chunks start on a group of rows");

void matmul_float(const WeightView& w, const float* x, float* y, int64_t m, ThreadPool* pool,
                  const IsaKernels& kt, MatmulScratch& s) {
  const int64_t rows = w.rows, cols = w.cols;
  const DType elem = w.type;
  assert(mm::is_float_panel_type(elem));
  // The activations in chain order, interleaved in groups of kActGroup rows
  // (float_panel.h), groups 64-byte aligned and padded by 16 floats (strides
  // of 2^n floats would share L1 sets).
  const int64_t xs = round_up(cols * mm::kActGroup, kDotLanes) + kDotLanes;
  const int64_t n_groups = (m + mm::kActGroup - 1) / mm::kActGroup;
  float* const xp = grow_aligned(s.x, n_groups * xs);  // [groups, xs]
  auto order = [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      mm::chain_order(x + i * cols, cols, xp + i / mm::kActGroup * xs + i % mm::kActGroup,
                      mm::kActGroup);
    }
  };
  // Prefill-sized batches permute on every thread (on one, the others
  // waited ~5 % of an F16 prefill for it).
  if (pool != nullptr && m > mm::kDecodeRows) {
    pool->parallel_for(m, order);
  } else {
    order(0, m, 0);
  }

  const int64_t n_panels = mm::panel_count(rows);
  const size_t pbytes = mm::float_panel_bytes(elem, cols);
  const int64_t per_block =
      std::max<int64_t>(2, static_cast<int64_t>(kFloatBlockBytes / pbytes) / 2 * 2);
  const int64_t chunk = std::min(m, kFloatChunk);
  // Views the model did not repack (tests, tools) are repacked a block at a
  // time into the thread's buffer: the same numbers, so the same bits.
  const bool own = w.panels == nullptr;
  auto run = [&](int64_t p_begin, int64_t p_end, int thread) {
    MatmulScratch::PerThread& ts = s.threads[thread];
    const int64_t np_max = std::min(per_block, p_end - p_begin);
    uint8_t* const buf = own ? grow(ts.panels, np_max * static_cast<int64_t>(pbytes)) : nullptr;
    float* const out = grow(ts.out, chunk * np_max * mm::kPanelRows);  // [chunk, np * 16]
    for (int64_t pb = p_begin; pb < p_end; pb += per_block) {
      const int64_t np = std::min(per_block, p_end - pb);
      const uint8_t* base;
      if (own) {
        for (int64_t p = 0; p < np; ++p) mm::repack_float_panel(w, pb + p, buf + p * pbytes);
        base = buf;
      } else {
        base = w.panels + static_cast<size_t>(pb) * pbytes;
      }
      const int64_t r0 = pb * mm::kPanelRows;
      const int64_t nr = std::min(np * mm::kPanelRows, rows - r0);
      for (int64_t i0 = 0; i0 < m; i0 += chunk) {
        const int64_t C = std::min(chunk, m - i0);
        kt.float_panels(elem, base, pbytes, np, cols, xp + i0 / mm::kActGroup * xs, xs, C, out);
        for (int64_t c = 0; c < C; ++c) {
          const float* o = out + c * np * mm::kPanelRows;
          float* yc = y + (i0 + c) * rows + r0;
          for (int64_t r = 0; r < nr; ++r) yc[r] = canon(o[r]);
        }
      }
    }
  };
  run_panels(n_panels, rows * cols * m, m, pool, run);
}

}  // namespace

bool matmul_uses_int8(DType t) { return mm::is_int_type(t); }

int64_t panel_count(int64_t rows) { return mm::panel_count(rows); }

size_t repacked_bytes(DType t, int64_t rows, int64_t cols) {
  size_t pbytes = 0;
  if (mm::is_int_type(t)) pbytes = mm::panel_bytes(t, cols);
  if (mm::is_float_panel_type(t)) pbytes = mm::float_panel_bytes(t, cols);
  return static_cast<size_t>(mm::panel_count(rows)) * pbytes;
}

void repack_panels(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end) {
  const bool is_int = mm::is_int_type(w.type);
  assert(is_int || mm::is_float_panel_type(w.type));
  const size_t pbytes =
      is_int ? mm::panel_bytes(w.type, w.cols) : mm::float_panel_bytes(w.type, w.cols);
  for (int64_t p = p_begin; p < p_end; ++p) {
    uint8_t* d = dst + static_cast<size_t>(p) * pbytes;
    if (is_int) {
      mm::repack_panel(w, p, d);
    } else {
      mm::repack_float_panel(w, p, d);
    }
  }
}

void get_row(const WeightView& w, int64_t row, float* out) {
  if (w.panels != nullptr && mm::is_float_panel_type(w.type)) {
    mm::float_panel_row(w, row, out);  // the same values, exactly
    return;
  }
  dequantize_row(w.type, w.data + static_cast<size_t>(row) * w.row_bytes, out, w.cols);
}

void matmul(const WeightView& w, const float* x, float* y, int64_t m, ThreadPool* pool, Isa isa,
            MatmulScratch* scratch) {
  if (m <= 0 || w.rows <= 0) return;
  if (!row_conversion_supported(w.type)) {
    float dummy = 0.0f;
    dequantize_row(w.type, w.data, &dummy, 0);  // throws the "type not supported" error
  }
  if (w.cols == 0) {
    std::fill(y, y + m * w.rows, 0.0f);  // an empty dot product is +0
    return;
  }
  assert(isa_supported(isa));
  const IsaKernels& kt = *kernel_table(isa).matmul;
  MatmulScratch local;
  MatmulScratch& s = scratch != nullptr ? *scratch : local;
  const size_t n_threads = pool != nullptr ? static_cast<size_t>(pool->size()) : 1;
  if (s.threads.size() < n_threads) s.threads.resize(n_threads);
  if (mm::is_int_type(w.type)) {
    matmul_int(w, x, y, m, pool, kt, s);
  } else {
    matmul_float(w, x, y, m, pool, kt, s);
  }
}

}  // namespace encore::kernels
