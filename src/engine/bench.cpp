// `encore bench` (include/encore/bench.h): the forward pass measured directly
// on the engine's scheduler thread, then requests through the scheduler.
#include "encore/bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "encore/error.h"
#include "engine/engine_impl.h"
#include "kernels/probe.h"

namespace encore {
namespace {

using BenchClock = std::chrono::steady_clock;

double seconds_since(BenchClock::time_point t0) {
  return std::chrono::duration<double>(BenchClock::now() - t0).count();
}

// Fixed, spread-out token ids (no BOS/EOS meaning needed for timing).
std::vector<int32_t> bench_tokens(int n, int n_vocab, int salt) {
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ids[static_cast<size_t>(i)] =
        static_cast<int32_t>((static_cast<int64_t>(i) * 7919 + salt * 104729 + 13) % n_vocab);
  }
  return ids;
}

// Sequences whose blocks go back to the engine's pool however the
// measurement ends (a leak would shrink the pool for every later request).
struct ScopedSeqs {
  KvBlockPool& pool;
  std::vector<KvSequence> seqs;
  ScopedSeqs(KvBlockPool& p, size_t n) : pool(p), seqs(n) {}
  ~ScopedSeqs() {
    for (KvSequence& s : seqs) s.release(pool);
  }
  KvSequence& operator[](size_t i) { return seqs[i]; }
};

// Prefill, decode at batch 1 and n_batch, bandwidth and peaks: the forward
// pass alone, on the scheduler thread.
void measure_forward(Engine::Impl& m, const BenchOptions& o, BenchReport& r) {
  ForwardContext& ctx = *m.ctx;
  KvBlockPool& pool = *m.pool;
  ThreadPool& threads = *m.threads;
  const HParams& hp = m.model->hparams();
  const Model::TokenCost cost = m.model->token_cost();
  std::vector<float> logits(static_cast<size_t>(hp.n_vocab));  // [n_vocab]

  // Warm-up: touches every weight once (page cache, TLB, lazy scratch).
  {
    ScopedSeqs seq(pool, 1);
    const std::vector<int32_t> warm = bench_tokens(4, hp.n_vocab, 99);
    ctx.eval(seq[0], warm, logits);
  }
  {
    ScopedSeqs seq(pool, 1);
    const std::vector<int32_t> prompt = bench_tokens(o.n_prompt, hp.n_vocab, 1);
    const auto t0 = BenchClock::now();
    ctx.eval(seq[0], prompt, logits);
    r.prefill_tok_s = o.n_prompt / seconds_since(t0);
  }
  // Decode at batch 1 (one token per step from a 1-token context) and with
  // n_batch sequences in every step, alternated with the bandwidth probe for
  // kRounds rounds; each figure is the best of its rounds, so that a burst of
  // load from other tenants of a shared machine hits neither side of a ratio
  // alone.
  constexpr int kRounds = 3;
  double decode_s = 1e30, batch_s = 1e30;
  for (int round = 0; round < kRounds; ++round) {
    {
      ScopedSeqs seq(pool, 1);
      const std::vector<int32_t> ids = bench_tokens(o.n_gen + 1, hp.n_vocab, 2 + round);
      ctx.eval(seq[0], std::span(ids).first(1), logits);
      const auto t0 = BenchClock::now();
      for (int i = 1; i <= o.n_gen; ++i) ctx.eval(seq[0], std::span(ids).subspan(i, 1), logits);
      decode_s = std::min(decode_s, seconds_since(t0));
    }
    r.bandwidth_gb_s = std::max(
        r.bandwidth_gb_s,
        kernels::measure_read_bandwidth(threads, static_cast<size_t>(o.bw_mib * 1048576.0)));
    {
      ScopedSeqs seqs(pool, static_cast<size_t>(o.n_batch));
      std::vector<std::vector<int32_t>> ids;
      std::vector<std::vector<float>> outs(static_cast<size_t>(o.n_batch),
                                           std::vector<float>(static_cast<size_t>(hp.n_vocab)));
      for (int s = 0; s < o.n_batch; ++s)
        ids.push_back(bench_tokens(o.n_gen + 1, hp.n_vocab, 10 + s));
      std::vector<SeqTokens> batch(static_cast<size_t>(o.n_batch));
      auto step_at = [&](int i) {
        for (size_t s = 0; s < batch.size(); ++s) {
          batch[s] =
              SeqTokens{&seqs[s], std::span(ids[s]).subspan(static_cast<size_t>(i), 1), outs[s]};
        }
        ctx.step(batch);
      };
      step_at(0);
      const auto t0 = BenchClock::now();
      for (int i = 1; i <= o.n_gen; ++i) step_at(i);
      batch_s = std::min(batch_s, seconds_since(t0));
    }
  }
  r.decode_tok_s = o.n_gen / decode_s;
  r.batch_tok_s = static_cast<double>(o.n_gen) * o.n_batch / batch_s;
  r.peak_fma_gflops = kernels::measure_fma_gflops(threads, ctx.isa());
  r.peak_int8_gops = kernels::measure_int8_gops(threads, ctx.isa());
  r.weight_bytes_per_token = cost.weight_bytes;
  r.macs_per_token = cost.macs;
  r.roofline_tok_s = r.bandwidth_gb_s * 1e9 / static_cast<double>(cost.weight_bytes);
  r.prefill_gops = r.prefill_tok_s * 2.0 * static_cast<double>(cost.macs) / 1e9;
  r.prefill_peak = 2 * cost.float_macs > cost.macs ? r.peak_fma_gflops : r.peak_int8_gops;
}

Request bench_request(const EngineInfo& info, int32_t prompt_len, int32_t n_gen, int salt,
                      const std::string& tenant) {
  Request q;
  q.prompt_ids = bench_tokens(prompt_len, info.n_vocab, 100 + salt);
  q.max_tokens = n_gen;
  q.ignore_eos = true;
  q.seed = static_cast<uint64_t>(salt);
  q.tenant = tenant;
  return q;
}

// Generated tokens per second: the requests one at a time, then all at once.
void measure_throughput(Engine& engine, const BenchOptions& o, BenchReport& r) {
  const EngineInfo& info = engine.info();
  // Distinct tenants: neither run finds the other's prompts in the cache.
  const std::string nonce = fmt::format("{}", BenchClock::now().time_since_epoch().count());
  int64_t tokens = 0;
  auto t0 = BenchClock::now();
  for (int k = 0; k < o.n_requests; ++k) {
    const Response resp =
        engine.run(bench_request(info, o.request_prompt, o.n_gen, k, "bench-seq-" + nonce));
    if (resp.status != Response::Status::Ok) throw ModelError(resp.error);
    tokens += resp.usage.generated_tokens;
  }
  r.sequential_tok_s = static_cast<double>(tokens) / seconds_since(t0);
  std::vector<RequestHandle> handles;
  tokens = 0;
  t0 = BenchClock::now();
  for (int k = 0; k < o.n_requests; ++k) {
    handles.push_back(
        engine.submit(bench_request(info, o.request_prompt, o.n_gen, k, "bench-batch-" + nonce)));
  }
  for (RequestHandle& h : handles) {
    const Response& resp = h.wait();
    if (resp.status != Response::Status::Ok) throw ModelError(resp.error);
    tokens += resp.usage.generated_tokens;
  }
  r.batch_throughput_tok_s = static_cast<double>(tokens) / seconds_since(t0);
}

// Time to first token over a long shared prefix: cold, then from the cache.
void measure_prefix(Engine& engine, const BenchOptions& o, BenchReport& r) {
  const EngineInfo& info = engine.info();
  constexpr int32_t kSuffix = 16;
  r.prefix_tokens = std::min(o.n_prefix, info.n_ctx - kSuffix - 2);
  if (r.prefix_tokens < info.kv_block_tokens) return;
  const std::vector<int32_t> prefix = bench_tokens(r.prefix_tokens, info.n_vocab, 7);
  const std::string tenant =
      fmt::format("bench-prefix-{}", BenchClock::now().time_since_epoch().count());
  auto ttft = [&](int salt, int64_t* cached) {
    Request q = bench_request(info, kSuffix, 1, salt, tenant);
    q.prompt_ids.insert(q.prompt_ids.begin(), prefix.begin(), prefix.end());
    const Response resp = engine.run(q);
    if (resp.status != Response::Status::Ok) throw ModelError(resp.error);
    if (cached) *cached = resp.usage.cached_tokens;
    return resp.ttft_seconds * 1e3;
  };
  r.cold_ttft_ms = ttft(1, nullptr);
  r.warm_ttft_ms = ttft(2, &r.warm_cached_tokens);
}

// A session of n_session tokens saved through a fresh engine with one tier,
// then its next turn in another fresh engine (an empty prefix cache): the
// time to first token restored, against the same turn recomputed.
void measure_state(Engine& engine, const Engine::Impl& m, const BenchOptions& o, BenchReport& r) {
  const EngineInfo& info = engine.info();
  constexpr int32_t kTurn = 16;
  r.session_tokens = std::min(o.n_session, info.n_ctx - kTurn - 2);
  if (r.session_tokens < info.kv_block_tokens) return;
  const std::string tenant =
      fmt::format("bench-state-{}", BenchClock::now().time_since_epoch().count());
  auto turn = [&](const EngineOptions& eo, bool persist, uint64_t* bytes) {
    // A File whose repacked matrices the engine gave back cannot be shared:
    // the new engine then reads the model again.
    const std::unique_ptr<Engine> e =
        m.file->released_bytes() > 0 ? Engine::open(eo) : Engine::open(m.file, eo);
    Request q = bench_request(info, r.session_tokens, 1, 3, tenant);
    const std::vector<int32_t> next = bench_tokens(kTurn, info.n_vocab, 4);
    q.prompt_ids.insert(q.prompt_ids.end(), next.begin(), next.end());
    q.persist = persist;
    const Response resp = e->run(q);
    if (resp.status != Response::Status::Ok) throw ModelError(resp.error);
    e->drain();
    if (bytes) {
      for (const auto& [name, c] : e->state_counters()) *bytes += c.bytes_read;
    }
    return resp.ttft_seconds * 1e3;
  };
  EngineOptions base = m.options;
  base.model_path = info.model_path;
  base.log = nullptr;
  for (int tier = 0; tier < 2; ++tier) {
    EngineOptions eo = base;
    eo.state_dir = tier == 0 ? o.state_dir : "";
    eo.redis_url = tier == 1 ? o.redis_url : "";
    if (eo.state_dir.empty() && eo.redis_url.empty()) continue;
    const double cold = turn(eo, /*persist=*/true, nullptr);  // computes and saves
    r.recompute_ms = r.recompute_ms == 0 ? cold : std::min(r.recompute_ms, cold);
    uint64_t bytes = 0;
    const double warm = turn(eo, false, &bytes);
    (tier == 0 ? r.restore_disk_ms : r.restore_redis_ms) = warm;
    (tier == 0 ? r.restore_disk_bytes : r.restore_redis_bytes) = bytes;
  }
}

}  // namespace

BenchReport run_bench(Engine& engine, const BenchOptions& o) {
  const EngineInfo& info = engine.info();
  if (o.n_prompt < 1 || o.n_prompt > info.n_ctx || o.n_gen < 1 || o.n_gen + 1 > info.n_ctx ||
      o.n_batch < 1) {
    throw InvalidArgument(fmt::format(
        "bench: prompt {} and decode {} tokens must fit the context size {} (batch {} >= 1)",
        o.n_prompt, o.n_gen, info.n_ctx, o.n_batch));
  }
  if (o.n_requests > 0 && o.request_prompt + o.n_gen > info.n_ctx) {
    throw InvalidArgument(fmt::format("bench: requests of {} + {} tokens exceed the context {}",
                                      o.request_prompt, o.n_gen, info.n_ctx));
  }
  const int64_t bt = info.kv_block_tokens;
  const int64_t need = std::max(kv_blocks_for_tokens(o.n_prompt, bt),
                                o.n_batch * kv_blocks_for_tokens(o.n_gen + 1, bt));
  if (need > info.kv_blocks) {
    throw InvalidArgument(fmt::format("bench: the KV pool has {} blocks; the measures need {}",
                                      info.kv_blocks, need));
  }
  BenchReport r;
  r.load_ms = info.load_seconds * 1e3;
  Engine::Impl& m = *engine.impl_;
  m.run_exclusive([&] { measure_forward(m, o, r); });
  if (o.n_requests > 0) measure_throughput(engine, o, r);
  if (o.n_prefix > 0) measure_prefix(engine, o, r);
  if (!o.state_dir.empty() || !o.redis_url.empty()) measure_state(engine, m, o, r);
  return r;
}

}  // namespace encore
