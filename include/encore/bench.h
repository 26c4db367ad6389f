// `encore bench`: speed of a model on this machine through an Engine, next to
// what the machine can do (memory bandwidth roofline, compute peak).
//
// Every number is measured in one run, so ratios between them are meaningful
// even on a shared, noisy machine; absolute numbers are not comparable
// between runs. Tokens are fixed pseudo-random ids: speed does not depend on
// which tokens run (the kernels have no data-dependent paths).
//
// Cost: seconds to minutes (a 1B model: prefill of 512 tokens, decode
// rounds, n_requests requests twice, a cold prefill of n_prefix tokens).
// Thread-safety: run_bench() must be the engine's only user while it runs.
#pragma once

#include <cstdint>

#include "encore/engine.h"

namespace encore {

struct BenchOptions {
  int32_t n_prompt = 512;  // prefill length
  int32_t n_gen = 32;      // decode steps per measurement, tokens per request
  int32_t n_batch = 8;     // concurrent sequences of the batched decode
  double bw_mib = 1024;    // bandwidth probe buffer
  // Through the engine's scheduler: n_requests requests (request_prompt
  // prompt tokens, n_gen generated each) all at once vs one at a time.
  int32_t n_requests = 32;  // 0: skip
  int32_t request_prompt = 8;
  // Time to first token with a shared prefix of n_prefix tokens, cold and
  // cached (capped to fit the context).
  int32_t n_prefix = 2000;  // 0: skip
  // Restore vs recompute of a session of n_session tokens (capped to fit the
  // context), through fresh engines on the same weights with only the state
  // directory, then only Redis: each measured when given.
  std::string state_dir;
  std::string redis_url;
  int32_t n_session = 2000;
};

struct BenchReport {
  double load_ms = 0;
  double prefill_tok_s = 0;
  double decode_tok_s = 0;
  double batch_tok_s = 0;  // n_batch sequences per step
  double bandwidth_gb_s = 0;
  uint64_t weight_bytes_per_token = 0;
  uint64_t macs_per_token = 0;
  double roofline_tok_s = 0;
  double prefill_gops = 0;
  double peak_fma_gflops = 0;
  double peak_int8_gops = 0;
  // The peak prefill is held against: FMA where most multiply-adds are on
  // float weights (F32/F16/BF16), else int8 (the quantised types).
  double prefill_peak = 0;
  // Engine throughput: generated tokens per second of wall time.
  double sequential_tok_s = 0;
  double batch_throughput_tok_s = 0;
  // Prefix cache: time to first token of a request whose prompt starts with
  // prefix_tokens shared tokens, computed cold and served from the cache.
  int32_t prefix_tokens = 0;
  double cold_ttft_ms = 0;
  double warm_ttft_ms = 0;
  int64_t warm_cached_tokens = 0;
  // State tiers: time to first token of the session's next turn when its KV
  // is recomputed vs restored (bytes read from the tier alongside).
  int32_t session_tokens = 0;
  double recompute_ms = 0;
  double restore_disk_ms = 0;
  double restore_redis_ms = 0;
  uint64_t restore_disk_bytes = 0;
  uint64_t restore_redis_bytes = 0;
};

// Throws InvalidArgument for options the model cannot run (n_prompt beyond
// the context, ...).
BenchReport run_bench(Engine& engine, const BenchOptions& options);

}  // namespace encore
