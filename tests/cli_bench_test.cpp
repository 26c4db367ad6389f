// `encore bench` and the numerics flags of `encore run` (--kv-type, --isa,
// -b) end to end.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "shared_data.h"

namespace encore::test {
namespace {

TEST(CliBench, JsonHasEveryFieldAndSaneValues) {
  ENCORE_SHARED_FILE(model, "models/stories260K.gguf");
  const CliResult r =
      run_encore({"bench", "-m", model, "-t", "2", "-p", "64", "-n", "4", "--batch", "8",
                  "--bw-mib", "32", "--requests", "6", "--prefix", "200", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* key :
       {"prefill_tok_s", "decode_tok_s", "decode_batch8_tok_s", "bandwidth_gb_s", "roofline_tok_s",
        "peak_fma_gflops", "prefill_gops", "load_ms", "sequential_tok_s", "batch_throughput_tok_s",
        "cold_ttft_ms", "warm_ttft_ms"}) {
    ASSERT_TRUE(j.contains(key)) << key << " missing in " << r.out;
    EXPECT_GT(j[key].get<double>(), 0.0) << key;
  }
  // The model's matrices: 5 layers x 7 of them plus the tied output, F32.
  ASSERT_TRUE(j.contains("weight_bytes_per_token"));
  EXPECT_GT(j["weight_bytes_per_token"].get<uint64_t>(), 500'000u);
  EXPECT_EQ(j["prefill_tokens"], 64);
  // F32 weights: prefill is held against the FMA peak, not the int8 one.
  EXPECT_EQ(j["prefill_peak"].get<double>(), j["peak_fma_gflops"].get<double>());
  EXPECT_EQ(j["requests"], 6);
  // The warm request found the shared prefix in the cache: all its full
  // blocks but the one holding its last prefix token.
  EXPECT_EQ(j["prefix_tokens"], 200);
  EXPECT_EQ(j["warm_cached_tokens"], 192);
}

TEST(CliBench, TableAndBadFlags) {
  ENCORE_SHARED_FILE(model, "models/stories260K.gguf");
  const CliResult r =
      run_encore({"bench", "-m", model, "-t", "1", "-p", "16", "-n", "2", "--bw-mib", "16"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("roofline tok/s"), std::string::npos) << r.out;
  const CliResult bad = run_encore({"bench", "-m", model, "--isa", "sse9"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("scalar, avx2, avxvnni or avx512"), std::string::npos) << bad.err;
}

// --types: one synthesised model per type, a row each (the mixes included),
// the models removed afterwards; a bad type is named.
TEST(CliBench, TypesTableSynthesisesAndRemovesEachModel) {
  TempDir dir;
  const CliResult r = run_encore({"bench", "--synth", "tiny", "--types", "Q8_0,Q4_K_M,BF16", "-t",
                                  "2", "-p", "16", "-n", "2", "--batch", "4", "--bw-mib", "16",
                                  "--synth-dir", dir.path.string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rows"].size(), 3u) << r.out;
  const char* types[] = {"Q8_0", "Q4_K_M", "BF16"};
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& row = j["rows"][i];
    EXPECT_EQ(row["type"], types[i]);
    for (const char* key : {"file_mib", "prefill_tok_s", "decode_tok_s", "batch_tok_s",
                            "decode_roofline_fraction", "prefill_peak_fraction"}) {
      EXPECT_GT(row[key].get<double>(), 0.0) << types[i] << " " << key;
    }
  }
  // Prefill against the int8 peak for the quantised types, FMA for BF16.
  for (size_t i = 0; i < 3; ++i) {
    const nlohmann::json& row = j["rows"][i];
    EXPECT_EQ(row["prefill_peak"].get<double>(),
              row[i == 2 ? "peak_fma_gflops" : "peak_int8_gops"].get<double>())
        << types[i];
  }
  // Q4_K_M is smaller than Q8_0, BF16 larger.
  EXPECT_LT(j["rows"][1]["file_mib"].get<double>(), j["rows"][0]["file_mib"].get<double>());
  EXPECT_GT(j["rows"][2]["file_mib"].get<double>(), j["rows"][0]["file_mib"].get<double>());
  EXPECT_TRUE(std::filesystem::is_empty(dir.path)) << "a synthesised model was left behind";
  const CliResult table = run_encore({"bench", "--synth", "tiny", "--types", "Q4_0", "-p", "8",
                                      "-n", "2", "--batch", "2", "--bw-mib", "16"});
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_NE(table.out.find("| Q4_0 |"), std::string::npos) << table.out;
  // A bad name is found before any model is made.
  const CliResult bad = run_encore(
      {"bench", "--synth", "tiny", "--types", "Q8_0,Q3_X", "--synth-dir", dir.path.string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("unknown --type 'Q3_X'"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.err.find("synthesising"), std::string::npos) << bad.err;
  EXPECT_EQ(j["threads"], 2);
}

// Outputs are identical for every ISA and prefill chunk size, and --kv-type
// is accepted as f16/f32 only.
TEST(CliRun, IsaAndBatchSizeDoNotChangeTheOutput) {
  ENCORE_SHARED_FILE(model, "models/stories260K.gguf");
  std::string first;
  for (const char* isa : {"scalar", "avx2", "avxvnni", "avx512"}) {
    for (const char* b : {"1", "3", "512"}) {
      const CliResult r =
          run_encore({"run", "-m", model, "-p", "Once upon a time there was", "-n", "24", "--temp",
                      "0.9", "--seed", "7", "--isa", isa, "-b", b, "--json"});
      if (r.exit_code != 0 && r.err.find("does not support") != std::string::npos) continue;
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const std::string ids = nlohmann::json::parse(r.out)["ids"].dump();
      if (first.empty()) first = ids;
      EXPECT_EQ(ids, first) << "isa " << isa << " -b " << b;
    }
  }
  const CliResult bad = run_encore({"run", "-m", model, "-n", "1", "--kv-type", "q8"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("expected f16 or f32"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace encore::test
