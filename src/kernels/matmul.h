// Matrix multiplication of model weights (any GGUF weight type) against a
// batch of activation rows: the hot loop of the forward pass.
//
// Invariance: y[i][r] depends only on weight row r and activation row i, and
// is computed in one canonical operation order (docs/invariance.md) whatever
// the ISA, the batch size m, the tile shape or the thread split: work is
// split across threads along output rows only, never along a reduction.
//
// Ownership: borrows everything for the call (a MatmulScratch, if given,
// keeps its buffers' capacity between calls). Thread-safety: reentrant
// (one call at a time per MatmulScratch); parallelises through the
// ThreadPool it is given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "encore/dtype.h"
#include "encore/isa.h"

namespace encore {
class ThreadPool;
}

namespace encore::kernels {

// The version of the canonical order of matmul_internal.h: part of the
// system fingerprint (encore/fingerprint.h), so state computed under another
// order is never used. 1: SIMD lanes along K (until engine 0.1.0); 2: one
// chain per output, lanes across rows of repacked panels (quantised types).
inline constexpr int kCanonicalOrder = 2;

// The version of the byte layout of repacked panels (panel.h): the key of
// files that hold them (src/model/panel_file.h). A new layout with the same
// numerics changes this, not kCanonicalOrder. 1: integer types only; 2: F32,
// F16 and BF16 in float panels too (float_panel.h).
inline constexpr int kPanelLayout = 2;

// Below this many multiply-adds a job is cheaper to run on the calling thread
// than to hand out (waking workers costs microseconds). Only speed depends on
// it: the split never changes results.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 16;

// A borrowed 2-D weight matrix stored row-major in any dequantisable dtype:
// `rows` rows of `cols` values each, row r starting at data + r * row_bytes.
// In GGUF terms cols = dims[0] and rows = dims[1]. F32 data is read in place
// as floats, so it must be aligned to alignof(float) (asserted; the model
// loader checks it for weights from files); other types are copied out
// block by block and may sit at any address.
struct WeightView {
  DType type = DType::F32;
  const uint8_t* data = nullptr;  // [rows, row_bytes]
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  // Optional, for the types with repacked_bytes > 0 (the integer types and
  // F32/F16/BF16): the same matrix repacked into row panels (repack_panels
  // below), which matmul then reads instead of `data`. Without it matmul
  // repacks on the fly (the same bits, more work per call).
  const uint8_t* panels = nullptr;  // [ceil(rows / 16), panel_bytes]
};

// Buffers of matmul that an owner keeps from one call to the next:
// allocated per call, buffers this size went back to the system on free and
// were faulted in again on the next call (3-5x slower float calls at 64
// rows). Holds capacity only: every element a call reads, that call wrote
// first (the integer path's zero padding included), so nothing passes from
// one call to the next. Grows to the largest call seen (Kp: K rounded up to
// 256):
// - float path: the activations in chain order, m * (K + 32) floats, and
//   per pool thread 48 * (rows of a block of panels, ~256 KiB of them)
//   floats of outputs, plus for a view without repacked panels that block;
// - integer path: the quantised activations (m rounded up to a whole block
//   of min(m, 8) rows), m * Kp bytes + m * Kp / 16 floats + m * Kp / 16
//   int32, and for a view
//   without repacked panels, per pool thread up to 4 panels (4 * 16 rows of
//   about the weights' own size).
// Not thread-safe: one matmul call at a time per scratch.
struct MatmulScratch {
  struct PerThread {
    std::vector<float> out;       // [chunk, rows of a block] float outputs
    std::vector<uint8_t> panels;  // [panels per block, panel bytes] repacked on the fly
  };
  std::vector<PerThread> threads;  // [pool size], by ThreadPool's `thread` index
  std::vector<float> x;            // [m, K + 32] the activations in chain order
  // The quantised activations, rows interleaved in blocks (mm::ActRows).
  std::vector<int8_t> act_q;  // [m, Kp] values
  std::vector<float> act_f;   // [2][m, Kp / 32] their scales and sums
  // [m, Kp / 16] their integer sums per 16 values (isum), then [m, Kp / 32] per group (qsum)
  std::vector<int32_t> act_i;
};

// y = x W^T for a batch of m activations: y[i][r] = sum_c W[r][c] * x[i][c].
// x: [m, w.cols], y: [m, w.rows] (must not alias x).
// pool may be null; small products (< kMinParallelWork) run on the caller.
// scratch may be null (buffers are then allocated for the call).
void matmul(const WeightView& w, const float* x, float* y, int64_t m, ThreadPool* pool, Isa isa,
            MatmulScratch* scratch = nullptr);

// One product of matmul_many: y = x w^T, y: [m, w->rows] (must not alias x
// or another entry's y).
struct MatmulOut {
  const WeightView* w = nullptr;
  float* y = nullptr;
};

// Several matrices of one input x: [m, cols] (every w->cols equal, else
// InvalidArgument), with
// the same bits as one matmul per entry: the activations are prepared once
// (quantised for the integer types, put in chain order for the float ones;
// Q/K/V and gate/up share theirs), and the matrices' panels are split across
// the pool in one pass (one wait for the threads, not one per matrix).
void matmul_many(std::span<const MatmulOut> outs, const float* x, int64_t m, ThreadPool* pool,
                 Isa isa, MatmulScratch* scratch = nullptr);

// True when matmul multiplies weights of type t as int8 dot products (the
// quantised types); false when it widens them to float and uses FMA.
bool matmul_uses_int8(DType t);

// Bytes of the repacked panels of a rows x cols matrix of type t (every
// type matmul takes: the integer types and F32/F16/BF16), else 0.
size_t repacked_bytes(DType t, int64_t rows, int64_t cols);
// Repacks w (a type with repacked_bytes > 0) into dst: [repacked_bytes(...)], panels
// [p_begin, p_end) only (so a caller can split the work across threads).
void repack_panels(const WeightView& w, uint8_t* dst, int64_t p_begin, int64_t p_end);
// The panels of a matrix of `rows` rows (the last one padded).
int64_t panel_count(int64_t rows);

// Dequantises row `row` of `w` into out: [w.cols]. Used for embedding lookup.
// Reads a float view's panels where it has them (a tied output head whose
// file bytes were given back), else its rows.
void get_row(const WeightView& w, int64_t row, float* out);

}  // namespace encore::kernels
