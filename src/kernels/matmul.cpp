// Matrix multiplication driver (see matmul.h): picks the kernel table for the
// ISA, prepares the activations once per input (quantised, or put in chain
// order; on every thread for prefill), splits the output rows of every
// matrix of that input across threads and walks them in cache-sized blocks
// of row panels (panel.h for
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
#include <span>
#include <string>
#include <vector>

#include "encore/error.h"
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
// while every block of up to kActRows activation rows (K bytes each, in L1
// or L2) passes over them. Only speed depends on it.
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

// Calls fn(j, p_begin, p_end) for the part of each matrix j whose panels
// fall in [b, e) of the matrices' panels laid end to end (offsets: [n + 1]
// first panel of each, then the total).
template <class Fn>
void for_segments(const std::vector<int64_t>& offsets, int64_t b, int64_t e, const Fn& fn) {
  for (size_t j = 0; j + 1 < offsets.size(); ++j) {
    const int64_t lo = std::max(b, offsets[j]), hi = std::min(e, offsets[j + 1]);
    if (lo < hi) fn(j, lo - offsets[j], hi - offsets[j]);
  }
}

// Runs rows [0, m) through prep(i0, i1): on every thread of the pool for
// prefill-sized batches (on one, the others waited for it), else on the
// caller. Threads take whole blocks of `block` rows (interleaved rows of
// one block share cache lines).
void prepare_rows(int64_t m, int64_t block, ThreadPool* pool, const ThreadPool::RangeFn& prep) {
  if (pool != nullptr && pool->size() > 1 && m > mm::kDecodeRows) {
    pool->parallel_for((m + block - 1) / block, [&](int64_t b0, int64_t b1, int thread) {
      prep(b0 * block, std::min(m, b1 * block), thread);
    });
  } else {
    prep(0, m, 0);
  }
}

// The activations of the integer path, quantised once for every matrix of
// one input (x: [m, cols]).
mm::ActRows quantize_activations(const float* x, int64_t cols, int64_t m, ThreadPool* pool,
                                 const IsaKernels& kt, MatmulScratch& s) {
  const int64_t kp = mm::padded_k(cols);
  const int64_t n_groups = kp / mm::kGroup, k_groups = cols / mm::kGroup;
  const int64_t block = std::min<int64_t>(m, kt.act_rows);
  const int64_t mr = round_up(m, block);  // rows allocated: whole blocks
  // Zero-padded to kp (quantize_act writes only the first cols values and
  // groups of a row; the kernels read only cols).
  int8_t* const act_q = grow(s.act_q, mr * kp);           // [mr / block, kp / 32, block, 32]
  float* const act_f = grow(s.act_f, 2 * mr * n_groups);  // [2][mr / block, kp / 32, block]
  // [mr / block, kp / 32, block, 2] isum, then [mr / block, kp / 32, block] qsum
  int32_t* const act_i = grow(s.act_i, mr * n_groups * 3);
  const ActRows act{.q = act_q,
                    .d = act_f,
                    .asum = act_f + mr * n_groups,
                    .isum = act_i,
                    .qsum = act_i + mr * n_groups * 2,
                    .kp = kp,
                    .block = block};
  prepare_rows(m, block, pool, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      kt.quantize_act(x + i * cols, cols, act, i);
      for (int64_t g = k_groups; g < n_groups; ++g) {
        std::fill_n(mm::act_q(act, i, g), mm::kGroup, int8_t{0});
        act.d[mm::act_at(act, i, g)] = act.asum[mm::act_at(act, i, g)] = 0.0f;
      }
      for (int64_t g = 0; g < n_groups; ++g) {
        const int8_t* qg = mm::act_q(act, i, g);
        int32_t lo = 0, hi = 0;
        for (int k = 0; k < 16; ++k) {
          lo += qg[k];
          hi += qg[16 + k];
        }
        act.isum[2 * mm::act_at(act, i, g)] = lo;
        act.isum[2 * mm::act_at(act, i, g) + 1] = hi;
        act.qsum[mm::act_at(act, i, g)] = lo + hi;
      }
    }
  });
  return act;
}

// Panels [p_begin, p_end) of integer matrix w against the quantised
// activations, with the calling pool thread's buffers ts.
void int_panels(const WeightView& w, float* y, const ActRows& act, int64_t m, const IsaKernels& kt,
                MatmulScratch::PerThread& ts, int64_t p_begin, int64_t p_end) {
  const int64_t rows = w.rows, cols = w.cols;
  const size_t pbytes = mm::panel_bytes(w.type, cols);
  const int64_t per_block = panels_per_block(m);
  // Views without repacked panels (tests, tools) are repacked a block at a
  // time into this thread's buffer: the same numbers, so the same bits.
  uint8_t* const own =
      w.panels == nullptr ? grow(ts.panels, per_block * static_cast<int64_t>(pbytes)) : nullptr;
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
    for (int64_t i0 = 0; i0 < m; i0 += act.block) {  // a block of rows per tile
      const int C = static_cast<int>(std::min<int64_t>(act.block, m - i0));
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

// The activations of the float path in chain order, once for every matrix
// of one input (x: [m, cols]): interleaved in groups of kActGroup rows
// (float_panel.h), groups 64-byte aligned and padded by 16 floats (strides
// of 2^n floats would share L1 sets), xs floats apart.
struct ChainOrdered {
  const float* xp = nullptr;  // [ceil(m / kActGroup), xs]
  int64_t xs = 0;
};
ChainOrdered chain_order_activations(const float* x, int64_t cols, int64_t m, ThreadPool* pool,
                                     MatmulScratch& s) {
  const int64_t xs = round_up(cols * mm::kActGroup, kDotLanes) + kDotLanes;
  const int64_t n_groups = (m + mm::kActGroup - 1) / mm::kActGroup;
  float* const xp = grow_aligned(s.x, n_groups * xs);  // [groups, xs]
  prepare_rows(m, mm::kActGroup, pool, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) {
      mm::chain_order(x + i * cols, cols, xp + i / mm::kActGroup * xs + i % mm::kActGroup,
                      mm::kActGroup);
    }
  });
  return {xp, xs};
}

// Panels [p_begin, p_end) of float matrix w against the chain-ordered
// activations, with the calling pool thread's buffers ts.
void float_panels(const WeightView& w, float* y, const ChainOrdered& a, int64_t m,
                  const IsaKernels& kt, MatmulScratch::PerThread& ts, int64_t p_begin,
                  int64_t p_end) {
  const int64_t rows = w.rows, cols = w.cols;
  const DType elem = w.type;
  assert(mm::is_float_panel_type(elem));
  const size_t pbytes = mm::float_panel_bytes(elem, cols);
  const int64_t per_block =
      std::max<int64_t>(2, static_cast<int64_t>(kFloatBlockBytes / pbytes) / 2 * 2);
  const int64_t chunk = std::min(m, kFloatChunk);
  // Views the model did not repack (tests, tools) are repacked a block at a
  // time into the thread's buffer: the same numbers, so the same bits.
  const bool own = w.panels == nullptr;
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
      kt.float_panels(elem, base, pbytes, np, cols, a.xp + i0 / mm::kActGroup * a.xs, a.xs, C, out);
      for (int64_t c = 0; c < C; ++c) {
        const float* o = out + c * np * mm::kPanelRows;
        float* yc = y + (i0 + c) * rows + r0;
        for (int64_t r = 0; r < nr; ++r) yc[r] = canon(o[r]);
      }
    }
  }
}

// The entries of outs with an integer (is_int) or float weight type, their
// matrices' panels laid end to end in one pass over the pool.
void run_family(std::span<const MatmulOut> outs, bool is_int, const float* x, int64_t m,
                ThreadPool* pool, const IsaKernels& kt, MatmulScratch& s) {
  std::vector<const MatmulOut*> mine;
  std::vector<int64_t> offsets{0};
  int64_t work = 0;
  for (const MatmulOut& o : outs) {
    if (o.w->rows <= 0 || mm::is_int_type(o.w->type) != is_int) continue;
    mine.push_back(&o);
    offsets.push_back(offsets.back() + mm::panel_count(o.w->rows));
    work += o.w->rows * o.w->cols * m;
  }
  if (mine.empty()) return;
  const int64_t cols = mine[0]->w->cols;
  // One pass over the pool for every matrix: panels(w, y, prepared, ...).
  auto pass = [&](const auto& prepared, auto panels) {
    run_panels(offsets.back(), work, m, pool, [&](int64_t b, int64_t e, int thread) {
      for_segments(offsets, b, e, [&](size_t j, int64_t p0, int64_t p1) {
        panels(*mine[j]->w, mine[j]->y, prepared, m, kt, s.threads[thread], p0, p1);
      });
    });
  };
  if (is_int) {
    pass(quantize_activations(x, cols, m, pool, kt, s), int_panels);
  } else {
    pass(chain_order_activations(x, cols, m, pool, s), float_panels);
  }
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

void matmul_many(std::span<const MatmulOut> outs, const float* x, int64_t m, ThreadPool* pool,
                 Isa isa, MatmulScratch* scratch) {
  if (m <= 0 || outs.empty()) return;
  const int64_t cols = outs[0].w->cols;
  for (const MatmulOut& o : outs) {
    if (o.w->cols != cols) {  // the activations are prepared for one width
      throw InvalidArgument("matmul_many: a matrix of " + std::to_string(o.w->cols) +
                            " columns among ones of " + std::to_string(cols) +
                            ": every matrix must take the same input");
    }
    if (o.w->rows <= 0) continue;  // nothing to compute
    if (!row_conversion_supported(o.w->type)) {
      float dummy = 0.0f;
      dequantize_row(o.w->type, o.w->data, &dummy, 0);  // throws the "type not supported" error
    }
    if (cols == 0) std::fill(o.y, o.y + m * o.w->rows, 0.0f);  // an empty dot product is +0
  }
  if (cols == 0) return;
  assert(isa_supported(isa));
  const IsaKernels& kt = *kernel_table(isa).matmul;
  MatmulScratch local;
  MatmulScratch& s = scratch != nullptr ? *scratch : local;
  const size_t n_threads = pool != nullptr ? static_cast<size_t>(pool->size()) : 1;
  if (s.threads.size() < n_threads) s.threads.resize(n_threads);
  run_family(outs, true, x, m, pool, kt, s);
  run_family(outs, false, x, m, pool, kt, s);
}

void matmul(const WeightView& w, const float* x, float* y, int64_t m, ThreadPool* pool, Isa isa,
            MatmulScratch* scratch) {
  const MatmulOut one{&w, y};
  matmul_many({&one, 1}, x, m, pool, isa, scratch);
}

}  // namespace encore::kernels
