// Content fingerprint: stable across load modes, thread counts and
// descriptive metadata; sensitive to tensor bytes and inference metadata
// (general.name included); cached by path and the opened file's stamp.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include "encore/fingerprint.h"
#include "encore/gguf.h"
#include "encore/thread_pool.h"
#include "encore/version.h"
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
  std::string description = "a tiny test model";
  uint32_t block_count = 2;
  int flip_byte = -1;  // index into the first tensor's data to change
  bool reorder_keys = false;
};

Writer make_model(const ModelSpec& spec) {
  Writer w;
  auto general = [&] {
    w.set("general.name", Value::make_string(spec.name));
    w.set("general.description", Value::make_string(spec.description));
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
  ThreadPool pool(n_threads);
  return model_fingerprint(File::from_bytes(make_model(spec).to_bytes()), pool);
}

TEST(GgufFingerprint, StableAcrossLoadModesAndThreads) {
  test::TempDir dir;
  const std::string path = dir.file("m.gguf");
  make_model({}).write(path);
  ThreadPool one(1);
  const std::string ref = model_fingerprint(File::open(path, LoadMode::Mmap), one);
  EXPECT_EQ(ref.size(), 32u);
  EXPECT_EQ(ref.find_first_not_of("0123456789abcdef"), std::string::npos);
  for (int threads : {1, 2, 3, 8, 64}) {
    ThreadPool pool(threads);
    EXPECT_EQ(model_fingerprint(File::open(path, LoadMode::Read), pool), ref) << threads;
    EXPECT_EQ(model_fingerprint(File::open(path, LoadMode::Mmap), pool), ref) << threads;
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
  ModelSpec described;
  described.description = "another description";
  EXPECT_EQ(fp_of(described), ref);
  ModelSpec reordered;
  reordered.reorder_keys = true;
  EXPECT_EQ(fp_of(reordered), ref);
  Writer realigned = make_model({});
  realigned.set("general.alignment", Value::make_u32(256));
  realigned.set("general.author", Value::make_string("someone"));
  ThreadPool pool(1);
  EXPECT_EQ(model_fingerprint(File::from_bytes(realigned.to_bytes()), pool), ref);
}

// vocab_from_gguf switches Phi-3's whitespace handling on general.name, so
// the name can change the output and must change the fingerprint.
TEST(GgufFingerprint, ChangesWithGeneralName) {
  ModelSpec renamed;
  renamed.name = "Phi-3 mini";
  EXPECT_NE(fp_of(renamed), fp_of({}));
}

TEST(GgufFingerprint, IgnoredKeys) {
  EXPECT_FALSE(fingerprint_ignores_key("general.name"));
  EXPECT_TRUE(fingerprint_ignores_key("general.author"));
  EXPECT_TRUE(fingerprint_ignores_key("general.description"));
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
  ThreadPool one(1), two(2);

  bool hit = true;
  File f = File::open(path, LoadMode::Mmap);
  EXPECT_EQ(model_fingerprint_cached(path, f, two, &hit, cache), ref);
  EXPECT_FALSE(hit);
  EXPECT_EQ(model_fingerprint_cached(path, f, two, &hit, cache), ref);
  EXPECT_TRUE(hit);
  EXPECT_EQ(model_fingerprint_cached(f, one, &hit, cache), ref);  // path from the File
  EXPECT_TRUE(hit);
  // A relative spelling of the same file finds the same entry.
  const auto cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());
  EXPECT_EQ(model_fingerprint_cached("./m.gguf", f, one, &hit, cache), ref);
  std::filesystem::current_path(cwd);
  EXPECT_TRUE(hit);

  // Same size, different content and mtime: the entry must not be used.
  ModelSpec changed;
  changed.flip_byte = 3;
  make_model(changed).write(path);
  struct timespec times[2] = {{0, 0}, {1234567, 890}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  File g = File::open(path, LoadMode::Read);
  const std::string changed_fp = model_fingerprint_cached(path, g, two, &hit, cache);
  EXPECT_FALSE(hit);
  EXPECT_EQ(changed_fp, fp_of(changed));
  EXPECT_NE(changed_fp, ref);
  EXPECT_EQ(model_fingerprint_cached(path, g, two, &hit, cache), changed_fp);
  EXPECT_TRUE(hit);
}

struct timespec mtime_of(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::stat(path.c_str(), &st), 0);
  return st.st_mtim;
}

void set_mtime(const std::string& path, const struct timespec& t) {
  const struct timespec times[2] = {t, t};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

// A size and mtime stamp taken from the path is not enough: a file replaced
// (new inode) or rewritten in place with the same size and the old mtime
// restored must be hashed again, or the cache pairs new bytes with the old
// fingerprint.
TEST(GgufFingerprint, CacheEntryInvalidAfterRewriteWithSameSizeAndMtime) {
  test::TempDir dir;
  const std::string cache = dir.file("cache");
  const std::string path = dir.file("m.gguf");
  ThreadPool one(1);
  make_model({}).write(path);
  const struct timespec mtime = mtime_of(path);
  const uint64_t size = std::filesystem::file_size(path);
  bool hit = true;
  {
    File f = File::open(path, LoadMode::Mmap);
    ASSERT_TRUE(f.stamp().has_value());
    EXPECT_EQ(f.stamp()->size, size);
    EXPECT_EQ(model_fingerprint_cached(path, f, one, &hit, cache), fp_of({}));
    EXPECT_FALSE(hit);
  }

  // Replaced by another file (Writer renames a temporary over it).
  ModelSpec replaced;
  replaced.flip_byte = 5;
  make_model(replaced).write(path);
  set_mtime(path, mtime);
  ASSERT_EQ(std::filesystem::file_size(path), size);
  {
    File f = File::open(path, LoadMode::Read);
    EXPECT_EQ(model_fingerprint_cached(path, f, one, &hit, cache), fp_of(replaced));
    EXPECT_FALSE(hit);
    EXPECT_EQ(model_fingerprint_cached(path, f, one, &hit, cache), fp_of(replaced));
    EXPECT_TRUE(hit);
  }

  // Rewritten in place (same inode), mtime restored. Only the ctime tells;
  // it is set to "now" by the clock's tick, so wait until it moves on.
  struct stat before;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  ModelSpec in_place;
  in_place.flip_byte = 9;
  const std::vector<uint8_t> bytes = make_model(in_place).to_bytes();
  for (;;) {
    {
      std::ofstream out(path, std::ios::binary | std::ios::in | std::ios::out);
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
    }
    set_mtime(path, mtime);
    struct stat after;
    ASSERT_EQ(::stat(path.c_str(), &after), 0);
    ASSERT_EQ(after.st_ino, before.st_ino);
    ASSERT_EQ(static_cast<uint64_t>(after.st_size), size);
    if (after.st_ctim.tv_sec != before.st_ctim.tv_sec ||
        after.st_ctim.tv_nsec != before.st_ctim.tv_nsec) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  {
    File f = File::open(path, LoadMode::Mmap);
    EXPECT_EQ(model_fingerprint_cached(path, f, one, &hit, cache), fp_of(in_place));
    EXPECT_FALSE(hit);
  }
}

TEST(GgufFingerprint, FileStampComesFromTheOpenedDescriptor) {
  test::TempDir dir;
  const std::string path = dir.file("m.gguf");
  make_model({}).write(path);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  for (LoadMode mode : {LoadMode::Read, LoadMode::Mmap}) {
    File f = File::open(path, mode);
    ASSERT_TRUE(f.stamp().has_value());
    EXPECT_EQ(f.stamp()->device, static_cast<uint64_t>(st.st_dev));
    EXPECT_EQ(f.stamp()->inode, static_cast<uint64_t>(st.st_ino));
    EXPECT_EQ(f.stamp()->size, static_cast<uint64_t>(st.st_size));
    EXPECT_EQ(f.stamp()->mtime_ns, int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec);
    EXPECT_EQ(f.stamp()->ctime_ns, int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec);
    // Replacing the path afterwards does not change what the File describes.
    ModelSpec other;
    other.block_count = 7;
    make_model(other).write(path);
    EXPECT_EQ(f.stamp()->inode, static_cast<uint64_t>(st.st_ino));
    make_model({}).write(path);
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
  }
  EXPECT_FALSE(File::from_bytes(make_model({}).to_bytes()).stamp().has_value());
}

TEST(GgufFingerprint, CorruptCacheEntryIsIgnored) {
  test::TempDir dir;
  const std::string cache = dir.file("cache");
  const std::string path = dir.file("m.gguf");
  make_model({}).write(path);
  File f = File::open(path);
  ThreadPool one(1);
  bool hit = false;
  const std::string ref = model_fingerprint_cached(path, f, one, &hit, cache);
  for (const auto& e : std::filesystem::directory_iterator(cache)) {
    std::ofstream(e.path(), std::ios::trunc) << "garbage\n";
  }
  EXPECT_EQ(model_fingerprint_cached(path, f, one, &hit, cache), ref);
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
  ThreadPool one(1);
  bool hit = true;
  EXPECT_EQ(model_fingerprint_cached(path, f, one, &hit, blocker + "/cache"), fp_of({}));
  EXPECT_FALSE(hit);
  EXPECT_EQ(model_fingerprint_cached(path, f, one, &hit, blocker + "/cache"), fp_of({}));
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

// --- system_fingerprint and the build id -----------------------------------

bool is_lower_hex(const std::string& s) {
  return s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST(SystemFingerprint, BuildIdIsStable16Hex) {
  const std::string id = build_id_string();
  EXPECT_EQ(id.size(), 16u);
  EXPECT_TRUE(is_lower_hex(id)) << id;
  EXPECT_EQ(std::string(build_id_string()), id);
  EXPECT_FALSE(std::string(engine_version_string()).empty());
}

TEST(SystemFingerprint, SameInputsSameStringAndFormat) {
  const std::string model_fp = fp_of({});
  const NumericsSettings s;
  const std::string a = system_fingerprint(model_fp, s);
  EXPECT_EQ(system_fingerprint(model_fp, s), a);
  EXPECT_EQ(system_fingerprint(model_fp, NumericsSettings{}), a);
  ASSERT_EQ(a.size(), 3u + 32u) << a;
  EXPECT_EQ(a.substr(0, 3), "fp_");
  EXPECT_TRUE(is_lower_hex(a.substr(3))) << a;
}

// Each input alone must change the fingerprint (strict: never a false "same").
TEST(SystemFingerprint, EachInputChangesIt) {
  const std::string model_fp = fp_of({});
  NumericsSettings base;
  base.rope_freq_base = 10000.0f;
  base.rope_freq_scale = 1.0f;
  const std::string ref = system_fingerprint(model_fp, base);

  ModelSpec other;
  other.flip_byte = 1;
  EXPECT_NE(system_fingerprint(fp_of(other), base), ref);
  EXPECT_NE(system_fingerprint("", base), ref);

  NumericsSettings kv = base;
  kv.kv_type = DType::F32;
  EXPECT_NE(system_fingerprint(model_fp, kv), ref);

  NumericsSettings rope_base = base;
  rope_base.rope_freq_base = 500000.0f;
  EXPECT_NE(system_fingerprint(model_fp, rope_base), ref);
  // One ulp is a different number, so a different fingerprint.
  rope_base.rope_freq_base = std::nextafter(10000.0f, 20000.0f);
  EXPECT_NE(system_fingerprint(model_fp, rope_base), ref);

  NumericsSettings order = base;
  order.canonical_order = 1;  // state of the kernels' first order
  EXPECT_NE(system_fingerprint(model_fp, order), ref);

  NumericsSettings rope_scale = base;
  rope_scale.rope_freq_scale = 0.25f;
  EXPECT_NE(system_fingerprint(model_fp, rope_scale), ref);

  // Swapping base and scale values must not collide (fields are named).
  NumericsSettings swapped;
  swapped.rope_freq_base = 1.0f;
  swapped.rope_freq_scale = 10000.0f;
  EXPECT_NE(system_fingerprint(model_fp, swapped), ref);
}

// Floats are hashed by bit pattern: -0.0 == 0.0 numerically, but not here.
TEST(SystemFingerprint, SignedZeroDiffers) {
  const std::string model_fp = fp_of({});
  NumericsSettings pos, neg_base, neg_scale;
  neg_base.rope_freq_base = -0.0f;
  neg_scale.rope_freq_scale = -0.0f;
  const std::string p = system_fingerprint(model_fp, pos);
  EXPECT_NE(system_fingerprint(model_fp, neg_base), p);
  EXPECT_NE(system_fingerprint(model_fp, neg_scale), p);
  EXPECT_NE(system_fingerprint(model_fp, neg_base), system_fingerprint(model_fp, neg_scale));
}

}  // namespace
}  // namespace encore
