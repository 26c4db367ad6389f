// `encore synth` presets and types: every file loads, runs and is printed by
// `encore inspect`. The 1b preset (TinyLlama-1.1B's shape) is labelled heavy.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string_view>

#include "cli_runner.h"
#include "shared_data.h"

namespace encore::test {
namespace {

const std::vector<std::string> kTypes = {"F32",  "F16",  "BF16", "Q8_0", "Q4_0", "Q4_1",
                                         "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"};

struct SynthCase {
  std::string preset;
  std::string type;
};

void PrintTo(const SynthCase& c, std::ostream* os) { *os << c.preset << " " << c.type; }

// The architecture a preset is made for (its keys are "<arch>.*").
std::string arch_of(const std::string& preset) {
  if (preset.find("qwen2") != std::string::npos) return "qwen2";
  if (preset.find("qwen3") != std::string::npos) return "qwen3";
  return "llama";
}

void synth_inspect_run(const SynthCase& c) {
  TempDir tmp;
  const std::string model = tmp.file(c.preset + "-" + c.type + ".gguf");
  const CliResult s =
      run_encore({"synth", "-o", model, "--preset", c.preset, "--type", c.type, "--seed", "3"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("random"), std::string::npos) << s.out;

  const CliResult i = run_encore({"inspect", model});
  ASSERT_EQ(i.exit_code, 0) << i.err;
  EXPECT_NE(i.out.find("blk.0.attn_q.weight"), std::string::npos);
  EXPECT_NE(i.out.find(" " + c.type + " "), std::string::npos) << "type column missing";
  EXPECT_NE(i.out.find("fingerprint:"), std::string::npos);
  EXPECT_NE(i.out.find(arch_of(c.preset) + ".block_count"), std::string::npos);

  const CliResult r = run_encore({"run", "-m", model, "-p", "once upon a time", "-n", "6", "--temp",
                                  "1.0", "--seed", "5", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("random weights"), std::string::npos) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const auto ids = j["ids"].get<std::vector<int>>();
  EXPECT_EQ(j["finish_reason"], ids.size() == 6 ? "length" : "eog");
  // Not degenerate: at temperature 1 the random model does not repeat one id.
  if (ids.size() == 6) {
    EXPECT_GT(std::set<int>(ids.begin(), ids.end()).size(), 1u);
  }
}

class SynthPresets : public ::testing::TestWithParam<SynthCase> {};
TEST_P(SynthPresets, SynthInspectRun) { synth_inspect_run(GetParam()); }

std::vector<SynthCase> cases(const std::string& preset) {
  std::vector<SynthCase> v;
  for (const std::string& t : kTypes) v.push_back({preset, t});
  return v;
}
std::string case_name(const ::testing::TestParamInfo<SynthCase>& info) {
  return info.param.preset + "_" + info.param.type;
}
// gtest names allow only [A-Za-z0-9_].
std::string case_name_safe(const ::testing::TestParamInfo<SynthCase>& info) {
  std::string n = case_name(info);
  for (char& ch : n) {
    if (ch == '-' || ch == '.') ch = '_';
  }
  return n;
}

#if ENCORE_SYNTH_HEAVY
// Built as its own executable (label "heavy"): 1.1B parameters per type.
INSTANTIATE_TEST_SUITE_P(B1, SynthPresets, ::testing::ValuesIn(cases("1b")), case_name);
// The other real shapes in two common types.
INSTANTIATE_TEST_SUITE_P(Big, SynthPresets,
                         ::testing::Values(SynthCase{"qwen3-0.6b", "Q8_0"},
                                           SynthCase{"qwen3-0.6b", "Q4_K"},
                                           SynthCase{"llama3-1b", "Q8_0"},
                                           SynthCase{"llama3-1b", "Q4_K"}),
                         case_name_safe);
#else
INSTANTIATE_TEST_SUITE_P(Tiny, SynthPresets, ::testing::ValuesIn(cases("tiny")), case_name);
INSTANTIATE_TEST_SUITE_P(M125, SynthPresets, ::testing::ValuesIn(cases("125m")), case_name);
// One per architecture feature: QKV biases, QK-norm with wide heads, rope_freqs.
INSTANTIATE_TEST_SUITE_P(TinyQwen2, SynthPresets, ::testing::ValuesIn(cases("tiny-qwen2")),
                         case_name_safe);
INSTANTIATE_TEST_SUITE_P(TinyQwen3, SynthPresets, ::testing::ValuesIn(cases("tiny-qwen3")),
                         case_name_safe);
INSTANTIATE_TEST_SUITE_P(TinyLlama3, SynthPresets, ::testing::ValuesIn(cases("tiny-llama3")),
                         case_name_safe);

TEST(Synth, PresetDecidesTheArchitecture) {
  TempDir tmp;
  const std::string model = tmp.file("q.gguf");
  CliResult r = run_encore({"synth", "-o", model, "--preset", "tiny-qwen3", "--type", "Q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("arch qwen3"), std::string::npos) << r.out;
  r = run_encore({"synth", "-o", model, "--preset", "tiny-qwen3", "--arch", "qwen3"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = run_encore({"synth", "-o", model, "--preset", "tiny-qwen3", "--arch", "llama"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("preset 'tiny-qwen3' is a qwen3 model"), std::string::npos) << r.err;
}

// The type `encore inspect` prints for one tensor ("" when absent).
std::string tensor_type(const std::string& inspect_out, const std::string& tensor) {
  std::istringstream in(inspect_out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream f(line);
    std::string name, type;
    if (f >> name >> type && name == tensor) return type;
  }
  return {};
}

// Q4_K_M / Q5_K_M as llama-quantize mixes them: output.weight (a tied
// token_embd.weight) and, in the layers use_more_bits picks (of 2: layer 1),
// attn_v and ffn_down in Q6_K. tiny-llama3 has an output matrix, tiny-qwen2
// a tied one.
TEST(Synth, KMMixesPutQ6KWhereLlamaQuantizeDoes) {
  TempDir tmp;
  for (const std::string mix : {"Q4_K_M", "Q5_K_M"}) {
    const std::string base = mix.substr(0, 4);
    const std::string tied = tmp.file(mix + "-tied.gguf");
    ASSERT_EQ(run_encore({"synth", "-o", tied, "--preset", "tiny-qwen2", "--type", mix}).exit_code,
              0);
    const CliResult ti = run_encore({"inspect", tied});
    EXPECT_EQ(tensor_type(ti.out, "token_embd.weight"), "Q6_K") << mix;
    EXPECT_EQ(tensor_type(ti.out, "output.weight"), "") << mix;
    const std::string model = tmp.file(mix + ".gguf");
    const CliResult s =
        run_encore({"synth", "-o", model, "--preset", "tiny-llama3", "--type", mix});
    ASSERT_EQ(s.exit_code, 0) << s.err;
    EXPECT_NE(s.out.find("type " + mix), std::string::npos) << s.out;
    const CliResult i = run_encore({"inspect", model});
    ASSERT_EQ(i.exit_code, 0) << i.err;
    EXPECT_EQ(tensor_type(i.out, "output.weight"), "Q6_K") << mix;
    EXPECT_EQ(tensor_type(i.out, "token_embd.weight"), base) << mix;
    EXPECT_EQ(tensor_type(i.out, "blk.1.attn_v.weight"), "Q6_K") << mix;
    EXPECT_EQ(tensor_type(i.out, "blk.1.ffn_down.weight"), "Q6_K") << mix;
    EXPECT_EQ(tensor_type(i.out, "blk.0.attn_v.weight"), base) << mix;
    EXPECT_EQ(tensor_type(i.out, "blk.0.ffn_down.weight"), base) << mix;
    EXPECT_EQ(tensor_type(i.out, "blk.1.attn_q.weight"), base) << mix;
    EXPECT_EQ(tensor_type(i.out, "blk.1.ffn_up.weight"), base) << mix;
    const CliResult r = run_encore({"run", "-m", model, "-p", "once", "-n", "4", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  const CliResult bad = run_encore({"synth", "-o", tmp.file("x.gguf"), "--type", "Q8_0_M"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("unknown --type 'Q8_0_M'"), std::string::npos) << bad.err;
}

std::string fingerprint_of(const std::string& model) {
  const CliResult i = run_encore({"inspect", model});
  const size_t at = i.out.find("fingerprint: ");
  return at == std::string::npos ? "" : i.out.substr(at, i.out.find(' ', at + 13) - at);
}

TEST(Synth, SameSeedSameBytesWhateverTheThreadCount) {
  TempDir tmp;
  ASSERT_EQ(run_encore({"synth", "-o", tmp.file("a.gguf"), "--type", "Q4_K", "-t", "1"}).exit_code,
            0);
  ASSERT_EQ(run_encore({"synth", "-o", tmp.file("b.gguf"), "--type", "Q4_K", "-t", "3"}).exit_code,
            0);
  ASSERT_EQ(
      run_encore({"synth", "-o", tmp.file("c.gguf"), "--type", "Q4_K", "--seed", "1"}).exit_code,
      0);
  EXPECT_EQ(read_file(tmp.file("a.gguf")), read_file(tmp.file("b.gguf")));
  EXPECT_NE(read_file(tmp.file("a.gguf")), read_file(tmp.file("c.gguf")));
  EXPECT_NE(fingerprint_of(tmp.file("a.gguf")), fingerprint_of(tmp.file("c.gguf")));
}

TEST(Synth, VocabFromAnotherModel) {
  ENCORE_SHARED_FILE(vocab, "testdata/vocab/ggml-vocab-llama-spm.gguf");
  TempDir tmp;
  const std::string model = tmp.file("m.gguf");
  const CliResult s = run_encore({"synth", "-o", model, "--vocab-from", vocab, "--type", "Q8_0"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  EXPECT_NE(s.out.find("vocab 32000"), std::string::npos) << s.out;
  const CliResult r = run_encore({"run", "-m", model, "-p", "Hello world", "-n", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Llama 2's tokenizer: BOS, "▁Hello", "▁world".
  EXPECT_EQ(nlohmann::json::parse(r.out)["prompt_ids"], nlohmann::json::parse("[1, 15043, 3186]"));
}

TEST(Synth, BadOptionsAreClearErrors) {
  TempDir tmp;
  CliResult r = run_encore({"synth", "-o", tmp.file("x.gguf"), "--preset", "huge"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown synth preset 'huge'"), std::string::npos) << r.err;
  r = run_encore({"synth", "-o", tmp.file("x.gguf"), "--type", "Q2_K"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("Q2_K"), std::string::npos) << r.err;
  r = run_encore({"synth", "-o", tmp.file("x.gguf"), "--arch", "gpt2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("--arch 'gpt2'"), std::string::npos) << r.err;
}

// Keys and tensor names are untrusted text: `encore inspect` prints them
// escaped, so a file cannot send control sequences to the terminal.
TEST(Inspect, EscapesUntrustedKeysAndTensorNames) {
  std::vector<char> b;
  const auto raw = [&](const void* p, size_t n) {
    b.insert(b.end(), static_cast<const char*>(p), static_cast<const char*>(p) + n);
  };
  const auto u32 = [&](uint32_t v) { raw(&v, 4); };
  const auto u64 = [&](uint64_t v) { raw(&v, 8); };
  const auto str = [&](std::string_view s) {
    u64(s.size());
    raw(s.data(), s.size());
  };
  b.assign({'G', 'G', 'U', 'F'});
  u32(3);
  u64(1);  // tensors
  u64(1);  // metadata
  str("evil\x1b]0;title\x07key");
  u32(8);  // string
  str("value");
  str("t\x1b[2J");
  u32(1);  // n_dims
  u64(4);
  u32(0);                                          // F32
  u64(0);                                          // offset
  b.resize((b.size() + 31) / 32 * 32 + 16, '\0');  // padding, then 4 floats of data
  TempDir tmp;
  const std::string model = tmp.file("evil.gguf");
  {
    std::ofstream out(model, std::ios::binary);
    out.write(b.data(), static_cast<std::streamsize>(b.size()));
  }
  const CliResult r = run_encore({"inspect", model});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("evil\\x1b]0;title\\x07key"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("t\\x1b[2J"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos);
  EXPECT_EQ(r.out.find('\x07'), std::string::npos);
}

#endif  // ENCORE_SYNTH_HEAVY

}  // namespace
}  // namespace encore::test
