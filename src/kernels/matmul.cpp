// Matrix multiplication driver (see matmul.h): picks the kernel table for the
// ISA, quantises the activations once per call, splits the output rows across
// threads and walks them in cache-sized blocks (row panels of the quantised
// types, widened rows of the float ones). The arithmetic (and its canonical
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

// A tile's outputs out: [C * R] into y: [m, rows] at activation rows i0..
// and weight rows r0.., NaNs canonical.
void store_tile(const float* out, int R, int C, float* y, int64_t rows, int64_t i0, int64_t r0) {
  for (int c = 0; c < C; ++c) {
    for (int r = 0; r < R; ++r) y[(i0 + c) * rows + r0 + r] = canon(out[c * R + r]);
  }
}

// The register tiles of output rows [r_begin, r_end) x activation rows
// [0, m) of the direct (in-place) kernels: tile(R, C, r0, i0, out) fills
// out: [C * R], which goes into y: [m, rows].
template <class Tile>
void direct_tiles(int64_t r_begin, int64_t r_end, int64_t m, float* y, int64_t rows,
                  const Tile& tile) {
  float out[mm::kMaxTileR * mm::kMaxTileC];
  for (int64_t r0 = r_begin; r0 < r_end; r0 += mm::kMaxTileR) {
    const int R = static_cast<int>(std::min<int64_t>(mm::kMaxTileR, r_end - r0));
    for (int64_t i0 = 0; i0 < m; i0 += mm::kMaxTileC) {
      const int C = static_cast<int>(std::min<int64_t>(mm::kMaxTileC, m - i0));
      tile(R, C, r0, i0, out);
      store_tile(out, R, C, y, rows, i0, r0);
    }
  }
}

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

// The first 64-byte aligned float of a buffer allocated 16 floats longer.
float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

// The float prefill path (F32, and F16/BF16 widened) blocks all three loops
// so that a 4 x 4 tile reads its operands from L1 and L2 rather than from
// L2 and L3: 64 widened weight rows (512 KiB at K = 2048) stay in L2 while
// chunks of 32 activation rows pass over them, K in blocks of 1024 values
// (one tile's slices of 4 weight and 4 activation rows: 32 KiB). Measured
// on 5632 x 2048 F16 at m = 512, 2 threads (AVX-512, Zen 5 class): 16 rows
// and whole K 175-210 GFLOP/s; this ~280-300 (K blocks of 512: ~260; 128
// rows: ~230; chunks of 8: ~240). AVX2 kernels: 84 -> 115. Not tuned for
// larger K: at K = 5632 (ffn_down of the 1b shape) the 64 rows take 1.4
// MiB, which still fit this 2 MiB L2; end to end the prefill gained ~30 %.
constexpr int64_t kFloatRowsPerBlock = 64;
constexpr int64_t kFloatChunk = 32;
constexpr int64_t kFloatKBlock = 1024;
static_assert(kFloatKBlock % kDotLanes == 0, "a K block must start on lane 0");
static_assert(kFloatChunk % mm::kMaxTileC == 0, "chunks are whole tiles");
int64_t float_rows_per_block(int64_t m) { return m <= mm::kDecodeRows ? 4 : kFloatRowsPerBlock; }

// Output rows are split between threads in whole register tiles, one
// contiguous range per thread (each thread then streams one run of rows;
// four claimable chunks per thread measured 3-6 % slower at decode).
void run_parallel(int64_t rows, int64_t work, ThreadPool* pool, const ThreadPool::RangeFn& fn) {
  if (pool == nullptr || pool->size() == 1 || work < kMinParallelWork) {
    fn(0, rows, 0);
    return;
  }
  const int64_t tiles = (rows + mm::kMaxTileR - 1) / mm::kMaxTileR;
  pool->parallel_for(tiles, [&](int64_t t0, int64_t t1, int thread) {
    fn(t0 * mm::kMaxTileR, std::min(rows, t1 * mm::kMaxTileR), thread);
  });
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
  if (pool == nullptr || pool->size() == 1 || rows * cols * m < kMinParallelWork) {
    run(0, n_panels, 0);
  } else {
    pool->parallel_for(n_panels, run, m <= mm::kDecodeRows ? 1 : kChunksPerThread);
  }
}

// n floats of v, 64-byte aligned.
float* grow_aligned(std::vector<float>& v, int64_t n) { return align64(grow(v, n + kDotLanes)); }

// Output rows [r_begin, r_end) of the float path through widened (or, for
// F32, in-place) weight rows: blocks of rb_rows rows, chunks of
// kFloatChunk activation rows, K in blocks of kb values; xa: [m, xs].
void float_blocked(const WeightView& w, const float* xa, int64_t xs, float* y, int64_t m,
                   int64_t r_begin, int64_t r_end, int64_t kb, const IsaKernels& kt,
                   MatmulScratch::PerThread& scratch) {
  const int64_t rows = w.rows, cols = w.cols;
  const bool in_place = w.type == DType::F32;
  const int64_t rb_rows = float_rows_per_block(m);
  // Each widened row is padded by 16 floats so the rows of a block do not
  // all fall on the same L1 cache sets (a 2^n-float row would).
  const int64_t w_pad = round_up(cols, kDotLanes) + kDotLanes;
  float* const widened = in_place ? nullptr : grow_aligned(scratch.w, rb_rows * w_pad);
  // The 16 canonical lanes of the outputs of a row block and a chunk of
  // activation rows, carried from one K block to the next: tile (ti, tr)
  // at acc + kTileAcc * (ti * n_tr + tr), pair (r, c) of the tile 16 floats
  // apart as float_tile wants.
  constexpr int64_t kTileAcc = int64_t{mm::kMaxTileR} * mm::kMaxTileC * kDotLanes;
  const int64_t max_tr = (rb_rows + mm::kMaxTileR - 1) / mm::kMaxTileR;
  float* const acc = grow_aligned(scratch.acc, kFloatChunk / mm::kMaxTileC * max_tr * kTileAcc);
  float out[mm::kMaxTileR * mm::kMaxTileC];  // [C * R] a tile's outputs
  for (int64_t rb = r_begin; rb < r_end; rb += rb_rows) {
    const int64_t nr = std::min(rb_rows, r_end - rb);
    const int64_t n_tr = (nr + mm::kMaxTileR - 1) / mm::kMaxTileR;
    const float* wr;
    int64_t stride;
    if (in_place) {
      wr = reinterpret_cast<const float*>(w.data + static_cast<size_t>(rb) * w.row_bytes);
      stride = static_cast<int64_t>(w.row_bytes / sizeof(float));
    } else {
      for (int64_t r = 0; r < nr; ++r) {
        kt.widen(w.type, w.data + static_cast<size_t>(rb + r) * w.row_bytes, cols,
                 widened + r * w_pad);
      }
      wr = widened;
      stride = w_pad;
    }
    for (int64_t ic = 0; ic < m; ic += kFloatChunk) {
      const int64_t ie = std::min(m, ic + kFloatChunk);
      // K blocks: a block's slice of the activation tile stays in L1 while
      // every weight tile of the row block passes over it. Each output's
      // lanes still see K in order: blocking K changes no bit.
      for (int64_t k0 = 0; k0 < cols; k0 += kb) {
        const int64_t kn = std::min(kb, cols - k0);
        float* const fin = k0 + kn == cols ? out : nullptr;  // the last block reduces
        for (int64_t i0 = ic; i0 < ie; i0 += mm::kMaxTileC) {
          const int C = static_cast<int>(std::min<int64_t>(mm::kMaxTileC, ie - i0));
          for (int64_t r0 = 0; r0 < nr; r0 += mm::kMaxTileR) {
            const int R = static_cast<int>(std::min<int64_t>(mm::kMaxTileR, nr - r0));
            float* tile = acc + kTileAcc * ((i0 - ic) / mm::kMaxTileC * n_tr + r0 / mm::kMaxTileR);
            kt.float_tile(R, C, wr + r0 * stride + k0, stride, xa + i0 * xs + k0, xs, kn, k0 == 0,
                          tile, fin);
            if (fin != nullptr) store_tile(out, R, C, y, rows, i0, rb + r0);
          }
        }
      }
    }
  }
}

void matmul_float(const WeightView& w, const float* x, float* y, int64_t m, ThreadPool* pool,
                  const IsaKernels& kt, MatmulScratch& s) {
  const int64_t rows = w.rows, cols = w.cols;
  // F32 rows are read in place; the model loader rejects F32 weights that are
  // not float-aligned (a file may declare an alignment of 1 or 2).
  assert(w.type != DType::F32 || (reinterpret_cast<uintptr_t>(w.data) % alignof(float) == 0 &&
                                  w.row_bytes % sizeof(float) == 0));
  // Small batches (decode) read F16/BF16 rows in place where the ISA can.
  if (w.type != DType::F32 && kt.has_direct_float != nullptr && kt.has_direct_float(w.type, m)) {
    run_parallel(rows, rows * cols * m, pool, [&](int64_t r_begin, int64_t r_end, int) {
      direct_tiles(
          r_begin, r_end, m, y, rows, [&](int R, int C, int64_t r0, int64_t i0, float* out) {
            kt.direct_float_tile(w.type, R, C, w.data + static_cast<size_t>(r0) * w.row_bytes,
                                 w.row_bytes, x + i0 * cols, cols, cols, out);
          });
    });
    return;
  }
  if (m <= mm::kDecodeRows) {  // a few rows (F32, or no direct kernel): whole K, no copy
    run_parallel(rows, rows * cols * m, pool, [&](int64_t r_begin, int64_t r_end, int thread) {
      float_blocked(w, x, cols, y, m, r_begin, r_end, cols, kt, s.threads[thread]);
    });
    return;
  }
  // Prefill: the activations are copied to 64-byte aligned rows (a vector
  // load that crosses a cache line costs two; engine buffers are only
  // 16-byte aligned), padded by 16 floats like the widened rows. The copy
  // is ~1/(2 * rows) of the arithmetic.
  const int64_t xs = round_up(cols, kDotLanes) + kDotLanes;
  float* const xa = grow_aligned(s.x, m * xs);  // [m, xs]
  for (int64_t i = 0; i < m; ++i) std::copy(x + i * cols, x + (i + 1) * cols, xa + i * xs);
  run_parallel(rows, rows * cols * m, pool, [&](int64_t r_begin, int64_t r_end, int thread) {
    float_blocked(w, xa, xs, y, m, r_begin, r_end, kFloatKBlock, kt, s.threads[thread]);
  });
}

}  // namespace

bool matmul_uses_int8(DType t) { return mm::is_int_type(t); }

int64_t panel_count(int64_t rows) { return mm::panel_count(rows); }

size_t repacked_bytes(DType t, int64_t rows, int64_t cols) {
  if (!mm::is_int_type(t)) return 0;
  return static_cast<size_t>(mm::panel_count(rows)) * mm::panel_bytes(t, cols);
}

void repack_panels(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end) {
  assert(mm::is_int_type(w.type));
  const size_t pbytes = mm::panel_bytes(w.type, w.cols);
  for (int64_t p = p_begin; p < p_end; ++p)
    mm::repack_panel(w, p, dst + static_cast<size_t>(p) * pbytes);
}

void get_row(const WeightView& w, int64_t row, float* out) {
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
