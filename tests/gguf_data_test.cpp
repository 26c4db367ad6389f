// GGUF reader against the real files in the shared data folder.
#include <gtest/gtest.h>

#include <filesystem>

#include "encore/fingerprint.h"
#include "encore/gguf.h"
#include "encore/thread_pool.h"
#include "shared_data.h"

namespace encore::gguf {
namespace {

TEST(GgufData, Stories260K) {
  ENCORE_SHARED_FILE(path, "models/stories260K.gguf");
  for (LoadMode mode : {LoadMode::Mmap, LoadMode::Read}) {
    File f = File::open(path, mode);
    EXPECT_EQ(f.version(), 3u);
    EXPECT_EQ(f.get_string("general.architecture"), "llama");
    EXPECT_EQ(f.get_u32("llama.embedding_length"), 64u);
    EXPECT_EQ(f.get_u32("llama.block_count"), 5u);
    const TensorInfo& emb = f.tensor("token_embd.weight");
    EXPECT_EQ(emb.type, DType::F32);
    EXPECT_EQ(emb.dims, (std::vector<uint64_t>{64, 512}));
    EXPECT_EQ(emb.n_bytes, 64u * 512 * 4);
    EXPECT_EQ(f.get_array("tokenizer.ggml.tokens").arr.size(), 512u);
    ThreadPool one(1), four(4);
    EXPECT_EQ(model_fingerprint(f, one), model_fingerprint(File::open(path, LoadMode::Read), four));
  }
}

TEST(GgufData, QuantizedVariants) {
  ENCORE_SHARED_FILE(f16, "models/stories260K-f16.gguf");
  ENCORE_SHARED_FILE(q8, "models/stories260K-ff192-q8_0.gguf");
  EXPECT_EQ(File::open(f16).tensor("blk.0.attn_q.weight").type, DType::F16);
  File q = File::open(q8, LoadMode::Mmap);
  EXPECT_EQ(q.tensor("blk.0.ffn_up.weight").type, DType::Q8_0);
}

TEST(GgufData, EveryVocabFileOpens) {
  ENCORE_SHARED_FILE(dir, "testdata/vocab");
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() != ".gguf") continue;
    SCOPED_TRACE(e.path().string());
    File f = File::open(e.path().string(), LoadMode::Mmap);
    EXPECT_TRUE(f.tensors().empty());
    EXPECT_GT(f.get_array("tokenizer.ggml.tokens").arr.size(), 1000u);
    EXPECT_FALSE(f.get_string("general.architecture").empty());
    ++n;
  }
  EXPECT_EQ(n, 12);
}

}  // namespace
}  // namespace encore::gguf
