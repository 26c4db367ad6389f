// Where the engine's repacked weights live (src/model/panel_file.h,
// Engine::open): with mmap, a panel cache file written once, then mapped and
// checked on every open (a damaged, truncated or foreign one is written
// again, and logged); read into memory, the model file's copy of what was
// repacked is given back. Each way gives the same bits as every other.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "encore/engine.h"
#include "encore/gguf.h"
#include "encore/synth.h"
#include "encore/thread_pool.h"
#include "engine_test_util.h"
#include "model/panel_file.h"
#include "util/little_endian.h"

namespace encore {
namespace {

namespace fs = std::filesystem;

class PanelCache : public ::testing::Test {
 protected:
  // A tied Q4_K_M model (Q4_K and Q6_K matrices, the Q6_K embeddings as the
  // output head), a Q8_0 one and an F16 one (float panels), on disk.
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    ThreadPool pool(2);
    for (const auto& [name, type] :
         {std::pair{"qkm", "Q4_K_M"}, std::pair{"q8", "Q8_0"}, std::pair{"f16", "F16"}}) {
      SynthOptions o;
      o.preset = "tiny";
      o.seed = 5;
      set_synth_type(o, type);
      synth_model(o, dir_->file(std::string(name) + ".gguf"), pool);
    }
  }
  static void TearDownTestSuite() { delete dir_; }

  static std::string model(const std::string& name = "qkm") { return dir_->file(name + ".gguf"); }

  EngineOptions options(bool mmap, const std::string& model_path) {
    EngineOptions o;
    o.model_path = model_path;
    o.mmap = mmap;
    o.threads = 2;
    o.n_ctx = 128;
    o.kv_bytes = 4 << 20;
    o.fingerprint_cache_dir = tmp_.file("fp");
    o.panel_cache_dir = panel_dir();
    o.log = [this](std::string_view l) {
      std::lock_guard<std::mutex> lock(mu_);
      log_.emplace_back(l);
    };
    return o;
  }
  std::unique_ptr<Engine> open(bool mmap, const std::string& path = model()) {
    return Engine::open(options(mmap, path));
  }
  std::string panel_dir() const { return tmp_.file("panels"); }
  std::string panel_path(const Engine& e) const {
    return panel_dir() + "/" + panel_file_name(e.info().model_fingerprint);
  }
  std::string logged() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string all;
    for (const std::string& l : log_) all += l + "\n";
    log_.clear();
    return all;
  }
  static Response generate(Engine& e) { return e.run(request(prompt_of(20, 3), 42, 12)); }
  // Changes the first matrix's panels in the mapped file of model_path,
  // keeps the digests matching, and checks that the output changes.
  void forge_and_check(const std::string& model_path);

  static test::TempDir* dir_;
  test::TempDir tmp_;
  std::mutex mu_;
  std::vector<std::string> log_;
};
test::TempDir* PanelCache::dir_ = nullptr;

std::string bytes_of(const std::string& path) { return test::read_file(path); }
void write_bytes(const std::string& path, const std::string& b) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << b;
}

TEST_F(PanelCache, WrittenOnceThenMappedWithTheSameBitsAsInMemory) {
  const Response in_memory = generate(*open(false));
  std::string first_file;
  {
    auto e = open(true);
    EXPECT_EQ(e->info().panels, "panel cache written");
    EXPECT_EQ(e->info().panel_file, panel_path(*e));
    EXPECT_GT(e->info().panel_bytes, 0u);
    EXPECT_TRUE(same_output(in_memory, generate(*e)));
    first_file = bytes_of(panel_path(*e));
  }
  auto e = open(true);
  EXPECT_EQ(e->info().panels, "panel cache hit");
  EXPECT_TRUE(same_output(in_memory, generate(*e)));
  EXPECT_EQ(bytes_of(panel_path(*e)), first_file);  // not written again
  EXPECT_EQ(logged(), "");
  // The other model gets its own file.
  auto q8 = open(true, model("q8"));
  EXPECT_EQ(q8->info().panels, "panel cache written");
  EXPECT_NE(panel_path(*q8), panel_path(*e));
  // Float weights are repacked too (float panels), and mapped the same way.
  const Response f16_in_memory = generate(*open(false, model("f16")));
  EXPECT_EQ(open(true, model("f16"))->info().panels, "panel cache written");
  auto f16 = open(true, model("f16"));
  EXPECT_EQ(f16->info().panels, "panel cache hit");
  EXPECT_TRUE(same_output(f16_in_memory, generate(*f16)));
  EXPECT_FALSE(same_output(in_memory, generate(*f16)));  // another model, other tokens
}

// A file whose panels differ but whose digests agree (as a forger, or a bug
// in the writer, would make it) is used, and changes the output: the engine
// multiplies with the mapped file, not with a copy of its own.
// Both families: the integer panels (Q4_K_M) and the float ones (F16).
TEST_F(PanelCache, TheMappedFileIsWhatTheKernelsRead) {
  for (const std::string name : {"qkm", "f16"}) {
    SCOPED_TRACE(name);
    forge_and_check(model(name));
  }
}

void PanelCache::forge_and_check(const std::string& model_path) {
  const Response original = generate(*open(true, model_path));
  std::string path;
  {
    auto e = open(true, model_path);
    path = panel_path(*e);
  }
  std::string b = bytes_of(path);
  // The documented header (panel_file.h): 92 fixed bytes, the path, then
  // 48-byte matrix entries (offset at +24, bytes at +32, digest at +40).
  const uint64_t header_bytes = le::get(b, 24, 8), n = le::get(b, 20, 4);
  const uint64_t entries = 92 + le::get(b, 88, 4);
  const uint64_t off = le::get(b, entries + 24, 8), len = le::get(b, entries + 32, 8);
  for (uint64_t i = 0; i < len; ++i) b[header_bytes + off + i] ^= 0x11;  // matrix 0: wq
  std::string d;
  le::put_u64(d, XXH3_64bits(b.data() + header_bytes + off, len));
  b.replace(entries + 40, 8, d);
  const uint64_t digest_at = entries + n * 48;
  d.clear();
  le::put_u64(d, XXH3_64bits(b.data(), digest_at));
  b.replace(digest_at, 8, d);
  write_bytes(path, b);

  auto e = open(true, model_path);
  EXPECT_EQ(e->info().panels, "panel cache hit");
  EXPECT_FALSE(same_output(original, generate(*e)));
  EXPECT_EQ(logged(), "");
}

TEST_F(PanelCache, DamagedTruncatedOrForeignFilesAreWrittenAgain) {
  const Response original = generate(*open(true));
  std::string path, other;
  {
    auto e = open(true);
    path = panel_path(*e);
    other = panel_path(*open(true, model("q8")));
  }
  const std::string good = bytes_of(path);
  struct Case {
    std::string name, bytes, why;
  };
  std::string flipped = good;
  flipped[flipped.size() - 100] ^= 1;  // in the output head's panels
  std::string header = good;
  header[60] ^= 1;  // in the model fingerprint
  const std::vector<Case> cases = {
      {"a flipped panel bit", flipped, "do not match their digest"},
      {"a flipped header bit", header, "header digest"},
      {"truncated", good.substr(0, good.size() - 4096), "sizes"},
      {"empty", "", "not a panel file"},
      {"another model's", bytes_of(other), "of another model"},
      {"a FIFO", "", "not a regular file"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    fs::remove(path);
    if (c.name == "a FIFO") {
      ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);  // must not hang the open
    } else {
      write_bytes(path, c.bytes);
    }
    auto e = open(true);
    EXPECT_EQ(e->info().panels, "panel cache written");
    const std::string log = logged();
    EXPECT_NE(log.find(path), std::string::npos) << log;
    EXPECT_NE(log.find(c.why), std::string::npos) << log;
    EXPECT_NE(log.find("writing it again"), std::string::npos) << log;
    EXPECT_TRUE(same_output(original, generate(*e)));
    EXPECT_EQ(bytes_of(path), good);
  }
}

TEST_F(PanelCache, AnUnwritableDirectoryKeepsThePanelsInMemory) {
  const Response original = generate(*open(false));
  write_bytes(tmp_.file("not-a-dir"), "x");
  EngineOptions o = options(true, model());
  o.panel_cache_dir = tmp_.file("not-a-dir") + "/panels";
  auto e = Engine::open(o);
  EXPECT_EQ(e->info().panels, "memory");
  EXPECT_EQ(e->info().panel_file, "");
  const std::string log = logged();
  EXPECT_NE(log.find("cannot write the panel cache"), std::string::npos) << log;
  EXPECT_TRUE(same_output(original, generate(*e)));
}

// Read into memory by the engine itself, the model file's bytes of every
// repacked matrix are given back; a tied quantised output head's are the
// embeddings, still read, and stay (or the output would change), while a
// tied float head's go back too. A File shared with the caller keeps
// everything.
TEST_F(PanelCache, AnEngineOwningItsFileGivesBackWhatItRepacked) {
  const auto shared = std::make_shared<const gguf::File>(gguf::File::open(model()));
  EngineOptions o = options(false, "");
  auto kept = Engine::open(shared, o);
  EXPECT_EQ(shared->released_bytes(), 0u);
  EXPECT_EQ(kept->info().panels, "memory");
  // A fresh fingerprint cache: the owner hashes the model before giving
  // anything back (else the fingerprint would be of zeros).
  o = options(false, model());
  o.fingerprint_cache_dir = tmp_.file("fp-owned");
  auto owned = Engine::open(o);
  EXPECT_EQ(owned->info().model_fingerprint, kept->info().model_fingerprint);
  EXPECT_FALSE(owned->info().model_fingerprint_cached);
  const uint64_t embd = shared->tensor("token_embd.weight").n_bytes;
  // Every matrix but the tied head, less a partial page at each end.
  const uint64_t repacked_source = shared->file_size() - embd;
  EXPECT_GT(owned->info().released_bytes, 0u);
  EXPECT_LT(owned->info().released_bytes, repacked_source);
  EXPECT_TRUE(same_output(generate(*kept), generate(*owned)));
  // A tied F16 head: embedding lookups read its float panels (exact
  // copies), so its bytes go back too, and the output stays the same.
  // Fails when lookups read the given-back (zeroed) bytes, or when the
  // head's bytes are kept (less than every matrix but the head).
  const auto f16_file = std::make_shared<const gguf::File>(gguf::File::open(model("f16")));
  auto f16_kept = Engine::open(f16_file, options(false, ""));
  o = options(false, model("f16"));
  o.fingerprint_cache_dir = tmp_.file("fp-owned-f16");
  auto f16_owned = Engine::open(o);
  const uint64_t f16_embd = f16_file->tensor("token_embd.weight").n_bytes;
  EXPECT_GT(f16_owned->info().released_bytes, f16_file->file_size() - f16_embd);
  EXPECT_TRUE(same_output(generate(*f16_kept), generate(*f16_owned)));
  // A File that gave bytes back is never shared with another engine.
  auto file = std::make_shared<gguf::File>(gguf::File::open(model()));
  file->release(file->tensor("blk.0.attn_q.weight").bytes());
  EXPECT_THROW(Engine::open(file, o), std::logic_error);
}

}  // namespace
}  // namespace encore
