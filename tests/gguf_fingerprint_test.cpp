// Content fingerprint: stable across load modes, thread counts and
// descriptive metadata; sensitive to tensor bytes and inference metadata;
// cached by path, size and mtime.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "encore/fingerprint.h"
#include "encore/gguf.h"
#include "gguf_test_util.h"

namespace encore {
namespace {

using gguf::File;
using gguf::LoadMode;
using gguf::Value;
using gguf::ValueType;
using gguf::Writer;

struct ModelSpec {
  std::string name = "tiny";
  uint32_t block_count = 2;
  int flip_byte = -1;  // index into the first tensor's data to change
  bool reorder_keys = false;
};

Writer make_model(const ModelSpec& spec) {
  Writer w;
  auto general = [&] {
    w.set("general.name", Value::make_string(spec.name));
    w.set("general.architecture", Value::make_string("llama"));
  };
  if (!spec.reorder_keys) general();
  w.set("llama.block_count", Value::make_u32(spec.block_count));
  w.set("llama.embedding_length", Value::make_u32(8));
  w.set("tokenizer.ggml.tokens",
        Value::make_array(ValueType::STRING, {Value::make_string("a"), Value::make_string("b")}));
  if (spec.reorder_keys) general();
  for (int k = 0; k < 7; ++k) {
    std::vector<uint8_t> data(8 * 4 * 4);
    for (size_t j = 0; j < data.size(); ++j) data[j] = static_cast<uint8_t>(j * 7 + k);
    if (k == 0 && spec.flip_byte >= 0) data[spec.flip_byte] ^= 1;
    w.add_tensor(fmt::format("blk.{}.weight", k), DType::F32, {8, 4}, std::move(data));
  }
  return w;
}

std::string fp_of(const ModelSpec& spec, int n_threads = 1) {
  return model_fingerprint(File::from_bytes(make_model(spec).to_bytes()), n_threads);
}

TEST(GgufFingerprint, StableAcrossLoadModesAndThreads) {
  test::TempDir dir;
  const std::string path = dir.file("m.gguf");
  make_model({}).write(path);
  const std::string ref = model_fingerprint(File::open(path, LoadMode::Mmap), 1);
  EXPECT_EQ(ref.size(), 32u);
  EXPECT_EQ(ref.find_first_not_of("0123456789abcdef"), std::string::npos);
  for (int threads : {0, 1, 2, 3, 8, 64}) {
    EXPECT_EQ(model_fingerprint(File::open(path, LoadMode::Read), threads), ref) << threads;
    EXPECT_EQ(model_fingerprint(File::open(path, LoadMode::Mmap), threads), ref) << threads;
  }
  EXPECT_EQ(fp_of({}), ref);
}

TEST(GgufFingerprint, ChangesWithContent) {
  const std::string ref = fp_of({});
  ModelSpec byte;
  byte.flip_byte = 77;
  EXPECT_NE(fp_of(byte, 4), ref);
  ModelSpec meta;
  meta.block_count = 3;
  EXPECT_NE(fp_of(meta), ref);
}

TEST(GgufFingerprint, IgnoresDescriptiveMetadataAndLayout) {
  const std::string ref = fp_of({});
  ModelSpec renamed;
  renamed.name = "another name";
  EXPECT_EQ(fp_of(renamed), ref);
  ModelSpec reordered;
  reordered.reorder_keys = true;
  EXPECT_EQ(fp_of(reordered), ref);
  Writer realigned = make_model({});
  realigned.set("general.alignment", Value::make_u32(256));
  EXPECT_EQ(model_fingerprint(File::from_bytes(realigned.to_bytes())), ref);
}

TEST(GgufFingerprint, IgnoredKeys) {
  EXPECT_TRUE(fingerprint_ignores_key("general.name"));
  EXPECT_TRUE(fingerprint_ignores_key("general.license.link"));
  EXPECT_TRUE(fingerprint_ignores_key("general.source.url"));
  EXPECT_TRUE(fingerprint_ignores_key("general.file_type"));
  EXPECT_FALSE(fingerprint_ignores_key("general.architecture"));
  EXPECT_FALSE(fingerprint_ignores_key("general.quantization_version"));
  EXPECT_FALSE(fingerprint_ignores_key("general.names"));
  EXPECT_FALSE(fingerprint_ignores_key("llama.block_count"));
  EXPECT_FALSE(fingerprint_ignores_key("tokenizer.chat_template"));
}

TEST(GgufFingerprint, CacheHitAndInvalidation) {
  test::TempDir dir;
  const std::string cache = dir.file("cache");
  const std::string path = dir.file("m.gguf");
  make_model({}).write(path);
  const std::string ref = fp_of({});

  bool hit = true;
  File f = File::open(path, LoadMode::Mmap);
  EXPECT_EQ(model_fingerprint_cached(path, f, 2, &hit, cache), ref);
  EXPECT_FALSE(hit);
  EXPECT_EQ(model_fingerprint_cached(path, f, 2, &hit, cache), ref);
  EXPECT_TRUE(hit);
  EXPECT_EQ(model_fingerprint_cached(f, 1, &hit, cache), ref);  // path from the File
  EXPECT_TRUE(hit);
  // A relative spelling of the same file finds the same entry.
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  EXPECT_EQ(model_fingerprint_cached("./m.gguf", f, 1, &hit, cache), ref);
  std::filesystem::current_path(cwd);
  EXPECT_TRUE(hit);

  // Same size, different content and mtime: the entry must not be used.
  ModelSpec changed;
  changed.flip_byte = 3;
  make_model(changed).write(path);
  struct timespec times[2] = {{0, 0}, {1234567, 890}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  File g = File::open(path, LoadMode::Read);
  const std::string changed_fp = model_fingerprint_cached(path, g, 2, &hit, cache);
  EXPECT_FALSE(hit);
  EXPECT_EQ(changed_fp, fp_of(changed));
  EXPECT_NE(changed_fp, ref);
  EXPECT_EQ(model_fingerprint_cached(path, g, 2, &hit, cache), changed_fp);
  EXPECT_TRUE(hit);
}

TEST(GgufFingerprint, CorruptCacheEntryIsIgnored) {
  test::TempDir dir;
  const std::string cache = dir.file("cache");
  const std::string path = dir.file("m.gguf");
  make_model({}).write(path);
  File f = File::open(path);
  bool hit = false;
  const std::string ref = model_fingerprint_cached(path, f, 1, &hit, cache);
  for (const auto& e : std::filesystem::directory_iterator(cache)) {
    std::ofstream(e.path(), std::ios::trunc) << "garbage\n";
  }
  EXPECT_EQ(model_fingerprint_cached(path, f, 1, &hit, cache), ref);
  EXPECT_FALSE(hit);
}

TEST(GgufFingerprint, UnwritableCacheStillComputes) {
  test::TempDir dir;
  const std::string path = dir.file("m.gguf");
  make_model({}).write(path);
  // A regular file where the cache folder should be: nothing can be created.
  const std::string blocker = dir.file("blocker");
  std::ofstream(blocker) << "x";
  File f = File::open(path);
  bool hit = true;
  EXPECT_EQ(model_fingerprint_cached(path, f, 1, &hit, blocker + "/cache"), fp_of({}));
  EXPECT_FALSE(hit);
  EXPECT_EQ(model_fingerprint_cached(path, f, 1, &hit, blocker + "/cache"), fp_of({}));
  EXPECT_FALSE(hit);
}

TEST(GgufFingerprint, DefaultCacheDirFollowsXdg) {
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old_xdg ? old_xdg : "";
  ::setenv("XDG_CACHE_HOME", "/some/cache", 1);
  EXPECT_EQ(fingerprint_cache_dir(), "/some/cache/encore/fingerprints");
  ::setenv("XDG_CACHE_HOME", "relative/ignored", 1);
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') {
    EXPECT_EQ(fingerprint_cache_dir(), std::string(home) + "/.cache/encore/fingerprints");
  }
  if (old_xdg) {
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  } else {
    ::unsetenv("XDG_CACHE_HOME");
  }
}

}  // namespace
}  // namespace encore
