// The invariance contract of the forward pass (docs/invariance.md), end to
// end: a token's logits are memcmp-identical whatever the thread count, the
// ISA, the other sequences sharing its steps (which, how many, in what
// order), the prefill chunk sizes, and whether K/V came from the cache or
// were computed in the same step. Identical, not close.
//
// Method: eight sequences of different lengths are run under many
// schedules; every schedule records the logits it asked for, keyed by
// (sequence, position), and each must equal the reference run: each sequence
// alone, one token per step, scalar kernels, one thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "encore/gguf.h"
#include "encore/isa.h"
#include "encore/model.h"
#include "encore/synth.h"
#include "encore/thread_pool.h"
#include "shared_data.h"

namespace encore {
namespace {

constexpr int kSeqs = 8;

// A step of a schedule: for each entry, `count` next tokens of sequence `seq`.
struct Part {
  int seq;
  int count;
};
using Schedule = std::vector<std::vector<Part>>;
using Trace = std::map<std::pair<int, int>, std::vector<float>>;  // (seq, last pos) -> logits

std::vector<std::vector<int32_t>> make_sequences(int n_vocab) {
  // Lengths spread over block boundaries (16) and chunk sizes (7, 64).
  const int lengths[kSeqs] = {1, 5, 16, 17, 33, 64, 70, 90};
  std::vector<std::vector<int32_t>> seqs;
  uint32_t state = 12345;
  for (int len : lengths) {
    std::vector<int32_t> s;
    for (int i = 0; i < len; ++i) {
      state = state * 1664525u + 1013904223u;
      s.push_back(static_cast<int32_t>((state >> 8) % static_cast<uint32_t>(n_vocab)));
    }
    seqs.push_back(s);
  }
  return seqs;
}

// Runs `schedule` and returns the logits after every part.
Trace run_schedule(const Model& model, const std::vector<std::vector<int32_t>>& tokens,
                   const Schedule& schedule, int threads, Isa isa, DType kv_type) {
  const KvLayout layout = kv_layout_for(model.hparams(), kv_type);
  KvBlockPool pool(layout, kv_bytes_for_tokens(layout, 128) * kSeqs);
  ThreadPool tp(threads);
  ForwardContext ctx(model, pool, tp, 128, isa);
  const size_t n_vocab = static_cast<size_t>(model.hparams().n_vocab);
  std::vector<KvSequence> seqs(tokens.size());
  Trace trace;
  for (const std::vector<Part>& step : schedule) {
    std::vector<SeqTokens> batch;
    std::vector<std::vector<float>> out(step.size(), std::vector<float>(n_vocab));
    for (size_t e = 0; e < step.size(); ++e) {
      const Part& p = step[e];
      KvSequence& seq = seqs[static_cast<size_t>(p.seq)];
      batch.push_back(SeqTokens{
          &seq, std::span(tokens[static_cast<size_t>(p.seq)]).subspan(seq.n_tokens, p.count),
          out[e]});
    }
    ctx.step(batch);
    for (size_t e = 0; e < step.size(); ++e) {
      const KvSequence& seq = seqs[static_cast<size_t>(step[e].seq)];
      trace[{step[e].seq, seq.n_tokens - 1}] = std::move(out[e]);
    }
  }
  for (KvSequence& s : seqs) s.release(pool);
  return trace;
}

// Each sequence alone, `chunk` tokens per step (0 = whole sequence).
Schedule alone(const std::vector<std::vector<int32_t>>& tokens, int chunk) {
  Schedule sch;
  for (int s = 0; s < static_cast<int>(tokens.size()); ++s) {
    const int len = static_cast<int>(tokens[static_cast<size_t>(s)].size());
    const int c = chunk == 0 ? len : chunk;
    for (int done = 0; done < len; done += c) sch.push_back({{s, std::min(c, len - done)}});
  }
  return sch;
}

// All sequences share every step, in the given order, each taking its own
// chunk size per step (so prefill chunks of some meet decode steps of others).
Schedule together(const std::vector<std::vector<int32_t>>& tokens, const std::vector<int>& order,
                  const std::vector<int>& chunk_of) {
  Schedule sch;
  std::vector<int> done(tokens.size(), 0);
  for (;;) {
    std::vector<Part> step;
    for (int s : order) {
      const int len = static_cast<int>(tokens[static_cast<size_t>(s)].size());
      const int left = len - done[static_cast<size_t>(s)];
      if (left == 0) continue;
      const int c = std::min(chunk_of[static_cast<size_t>(s)], left);
      step.push_back({s, c});
      done[static_cast<size_t>(s)] += c;
    }
    if (step.empty()) return sch;
    sch.push_back(step);
  }
}

// Every logits vector of `got` must be bit-identical to the reference's.
void expect_same(const Trace& ref, const Trace& got, const std::string& what) {
  ASSERT_FALSE(got.empty()) << what;
  int compared = 0;
  for (const auto& [key, logits] : got) {
    const auto it = ref.find(key);
    ASSERT_NE(it, ref.end()) << what << ": no reference for seq " << key.first << " pos "
                             << key.second;
    ASSERT_EQ(it->second.size(), logits.size());
    EXPECT_EQ(0, std::memcmp(it->second.data(), logits.data(), logits.size() * sizeof(float)))
        << what << ": logits of seq " << key.first << " at position " << key.second
        << " differ from the reference";
    ++compared;
  }
  EXPECT_GT(compared, 0) << what;
}

// The whole contract on one model file, for one KV element type.
void check_model(const std::string& path, DType kv_type) {
  const gguf::File file = gguf::File::open(path);
  const std::unique_ptr<Model> model = Model::load(file);
  const auto tokens = make_sequences(model->hparams().n_vocab);
  // Reference: alone, one token per step (every K/V but the newest read back
  // from the cache), scalar kernels, one thread, and the quantised weights
  // repacked on the fly by each matmul (the bare GGUF views).
  const Trace ref = run_schedule(*model, tokens, alone(tokens, 1), 1, Isa::Scalar, kv_type);
  // Everything else runs on the model's own repacked panels, as the engine
  // does: the reference pins that repacking at load changes no bit either.
  {
    ThreadPool repack_pool(2);
    model->repack_weights(repack_pool);
  }

  const std::vector<int> forward = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<int> backward = {7, 6, 5, 4, 3, 2, 1, 0};
  const std::vector<int> shuffled = {3, 7, 0, 5, 2, 6, 1, 4};
  const std::vector<int> mixed_chunks = {1, 7, 64, 3, 90, 1, 16, 5};
  // Every schedule on every ISA with 2 threads; 1 and 3 threads on the
  // schedule that mixes the most (enough to vary the thread split of every
  // kernel without multiplying the run time).
  for (Isa isa : supported_isas()) {
    for (int threads : {2, 1, 3}) {
      const std::string tag = std::string(isa_name(isa)) + " t" + std::to_string(threads);
      expect_same(ref,
                  run_schedule(*model, tokens, together(tokens, forward, mixed_chunks), threads,
                               isa, kv_type),
                  tag + " 8 together, mixed chunks");
      // AVX-VNNI's table is AVX2's but for the integer tiles, which the kernel
      // tests check in every shape: the one schedule above keeps this test's
      // run time.
      if (isa == Isa::AvxVnni) break;
      if (threads != 2) continue;
      for (int chunk : {1, 7, 64, 0}) {
        expect_same(ref, run_schedule(*model, tokens, alone(tokens, chunk), threads, isa, kv_type),
                    tag + " alone chunk " + std::to_string(chunk));
      }
      expect_same(
          ref,
          run_schedule(*model, tokens, together(tokens, backward, std::vector<int>(kSeqs, 1)),
                       threads, isa, kv_type),
          tag + " 8 together decoding, reversed");
      expect_same(
          ref,
          run_schedule(*model, tokens, together(tokens, shuffled, std::vector<int>(kSeqs, 7)),
                       threads, isa, kv_type),
          tag + " 8 together chunk 7, shuffled");
      // A sequence with 1, 4 and 7 companions.
      for (int n = 2; n <= kSeqs; n += 3) {
        const std::vector<int> some(shuffled.begin(), shuffled.begin() + n);
        expect_same(ref,
                    run_schedule(*model, tokens, together(tokens, some, mixed_chunks), threads, isa,
                                 kv_type),
                    tag + " " + std::to_string(n) + " together");
      }
    }
  }
}

class SynthInvariance : public ::testing::TestWithParam<std::pair<std::string, DType>> {};

TEST_P(SynthInvariance, LogitsAreBitIdenticalUnderEverySchedule) {
  const auto& [preset, type] = GetParam();
  test::TempDir dir;
  ThreadPool pool(2);
  SynthOptions o;
  o.preset = preset;
  o.type = type;
  o.seed = 5;
  const std::string path = dir.file("m.gguf");
  synth_model(o, path, pool);
  check_model(path, DType::F16);
}

std::vector<std::pair<std::string, DType>> synth_cases() {
  std::vector<std::pair<std::string, DType>> v;
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                  DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    v.push_back({"tiny", t});
  }
  for (const char* p : {"tiny-qwen2", "tiny-qwen3", "tiny-llama3"}) {
    v.push_back({p, DType::Q8_0});
    v.push_back({p, DType::Q4_K});
  }
  return v;
}

std::string case_name(const ::testing::TestParamInfo<std::pair<std::string, DType>>& info) {
  std::string n = info.param.first + "_" + dtype_name(info.param.second);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

INSTANTIATE_TEST_SUITE_P(Types, SynthInvariance, ::testing::ValuesIn(synth_cases()), case_name);

TEST(StoriesInvariance, LogitsAreBitIdenticalUnderEverySchedule) {
  ENCORE_SHARED_FILE(path, "models/stories260K.gguf");
  check_model(path, DType::F32);
  check_model(path, DType::F16);
}

}  // namespace
}  // namespace encore
