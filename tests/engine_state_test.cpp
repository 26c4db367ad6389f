// Sessions and KV snapshots through the engine (state tiers of store.h):
// outputs are identical whether the KV came from the prefix cache, the disk,
// Redis, or was recomputed after the state was lost, damaged, flushed or
// made by another model; a session continues exactly in a new engine (a
// restart); tenants never see each other's state.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cli_runner.h"
#include "encore/engine.h"
#include "encore/gguf.h"
#include "encore/kv_cache.h"
#include "encore/run_state.h"
#include "encore/store.h"
#include "engine/session/persist.h"
#include "engine_test_util.h"
#include "redis_server.h"
#include "synth_test_util.h"

namespace encore {
namespace {

namespace fs = std::filesystem;

std::shared_ptr<const gguf::File> model_file(const std::string& preset, DType type) {
  return std::make_shared<const gguf::File>(
      gguf::File::from_bytes(test::synth_bytes(preset, type), preset + ".gguf"));
}

// Two samples each: both continue across the pause.
Request request2(std::vector<TokenId> prompt, uint64_t seed, int32_t max_tokens) {
  Request r = request(std::move(prompt), seed, max_tokens);
  r.n = 2;
  return r;
}

// The ids of a whole generation paused and continued: first + rest.
std::vector<TokenId> joined(const Response& first, const Response& rest, size_t i) {
  std::vector<TokenId> ids = first.samples[i].ids;
  ids.insert(ids.end(), rest.samples[i].ids.begin(), rest.samples[i].ids.end());
  return ids;
}

// The start of `whole`: its first `max_tokens`, saved as session `name`.
Request first_part(const Request& whole, int32_t max_tokens, const std::string& name) {
  Request first = whole;
  first.max_tokens = max_tokens;
  first.session = name;
  return first;
}

// `max_tokens` more of session `name` (no prompt: the saved generation goes
// on with its seed and sampler states).
Request continuation(const std::string& name, int32_t max_tokens) {
  Request rest;
  rest.session = name;
  rest.max_tokens = max_tokens;
  return rest;
}

// Both samples of `first` then `rest` are those of `want`, the whole
// generation run at once.
void expect_continues(const Response& first, const Response& rest, const Response& want) {
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(joined(first, rest, i), want.samples[i].ids) << i;
}

// The message of the NotFound that submitting `r` throws; a failure, saying
// `accepted`, when `e` takes the request instead.
std::string refusal(Engine& e, const Request& r, const std::string& accepted) {
  try {
    e.submit(r);
  } catch (const NotFound& err) {
    return err.what();
  }
  ADD_FAILURE() << accepted;
  return "";
}

class EngineState : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { file_ = new auto(model_file("tiny", DType::Q8_0)); }
  static void TearDownTestSuite() { delete file_; }

  // What every engine of these tests runs with: state in `state_dir` (none
  // if empty) and in Redis at `redis` (none if empty).
  static EngineOptions options(const std::string& state_dir, const std::string& redis = "") {
    EngineOptions o;
    o.threads = 2;
    o.n_ctx = 256;
    o.kv_bytes = 8 << 20;
    o.state_dir = state_dir;
    o.redis_url = redis;
    o.fingerprint_cache_dir = "/nonexistent";
    return o;
  }
  std::unique_ptr<Engine> open(const std::string& state_dir, const std::string& redis = "",
                               std::shared_ptr<const gguf::File> file = nullptr) {
    EngineOptions o = options(state_dir, redis);
    o.log = [this](std::string_view l) {  // called from several threads
      std::lock_guard<std::mutex> lock(log_mu_);
      log_.emplace_back(l);
    };
    return Engine::open(file ? file : *file_, o);
  }
  std::string dir() const { return tmp_.file("state"); }

  static std::shared_ptr<const gguf::File>* file_;
  std::vector<std::string> logged() {
    std::lock_guard<std::mutex> lock(log_mu_);
    return log_;
  }
  test::TempDir tmp_;
  std::mutex log_mu_;
  std::vector<std::string> log_;
};
std::shared_ptr<const gguf::File>* EngineState::file_ = nullptr;

// A generation that ends on the token it drew from the prompt's logits
// (max_tokens 1) never forks the prompt's KV into its samples; its prompt
// blocks are still written, and a new engine restores them. Without persist
// nothing is written.
TEST_F(EngineState, AGenerationOfOneTokenStillSavesItsPromptBlocks) {
  for (const bool persist : {true, false}) {
    test::TempDir d;
    Request r = request2(prompt_of(40, 3), 5, 1);
    r.persist = persist;
    {
      auto e = open(d.file("state"));
      const Response a = e->run(r);
      ASSERT_EQ(a.status, Response::Status::Ok) << a.error;
      EXPECT_EQ(a.samples[0].ids.size(), 1u);
      e->drain();
      EXPECT_EQ(e->stats().blocks_saved, persist ? 2 : 0);
    }
    const Response b = open(d.file("state"))->run(r);
    EXPECT_EQ(b.usage.restored_tokens, persist ? 32 : 0) << "persist " << persist;
  }
}

TEST_F(EngineState, ASessionContinuesExactlyInANewEngine) {
  const Request whole = request2(prompt_of(37, 1), 11, 40);
  const Response want = open("")->run(whole);
  const Request first = first_part(whole, 15, "chat-1");
  Response a;
  {
    auto e = open(dir());
    a = e->run(first);
    e->drain();
    EXPECT_EQ(e->stats().sessions_saved, 1);
    EXPECT_GT(e->stats().blocks_saved, 0);
  }
  // A restart: a new engine continues the session (no prompt: the saved
  // generation goes on with its seed and sampler states).
  auto e = open(dir());
  const Request rest = continuation("chat-1", 25);
  const Response b = e->run(rest);
  EXPECT_TRUE(b.session_found);
  expect_continues(a, b, want);
  EXPECT_EQ(b.seed, 11u);
  e->drain();
  const EngineStats s = e->stats();
  EXPECT_EQ(s.sessions_loaded, 1);
  EXPECT_GT(s.blocks_restored_disk, 0) << "the KV was recomputed instead of restored";
  EXPECT_GE(b.usage.restored_tokens, 32);
}

TEST_F(EngineState, AnAppendedPromptEqualsTheWholeConversationFromScratch) {
  Request turn1 = request2(prompt_of(21, 2), 5, 18);
  turn1.session = "conv";
  Response r1;
  {
    auto e = open(dir());
    r1 = e->run(turn1);
  }
  const std::vector<TokenId> added = {40, 41, 42, 43, 44, 45, 46};
  auto e = open(dir());
  Request turn2 = request2(added, 6, 12);
  turn2.session = "conv";
  const Response r2 = e->run(turn2);
  ASSERT_TRUE(r2.session_found);
  std::vector<TokenId> all = r1.prompt_ids;
  all.insert(all.end(), r1.samples[0].ids.begin(), r1.samples[0].ids.end());
  all.insert(all.end(), added.begin(), added.end());
  EXPECT_EQ(r2.prompt_ids, all);
  EXPECT_TRUE(same_output(r2, open("")->run(request2(all, 6, 12))));
  EXPECT_GE(r2.usage.cached_tokens, 32) << "the conversation so far was not restored";
}

TEST_F(EngineState, DamagedOrMissingSnapshotsAreRecomputedWithTheSameOutput) {
  const Request r = [] {
    Request q = request2(prompt_of(70, 3), 9, 10);
    q.persist = true;
    return q;
  }();
  Response cold;
  {
    auto e = open(dir());
    cold = e->run(r);
  }
  // Flip a byte in every other block file, truncate another.
  int n = 0;
  for (const auto& f : fs::recursive_directory_iterator(dir())) {
    if (f.path().extension() != ".snap") continue;
    const std::string p = f.path().string();
    std::string bytes = test::read_file(p);
    if (n % 3 == 0) bytes[bytes.size() / 2] ^= 0x40;
    if (n % 3 == 1) bytes.resize(bytes.size() / 3);
    std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
    ++n;
  }
  ASSERT_GE(n, 4);
  auto e = open(dir());
  EXPECT_TRUE(same_output(e->run(r), cold));
  e->drain();
  bool told = false;
  for (const std::string& l : logged()) told |= l.find("will be recomputed") != std::string::npos;
  EXPECT_TRUE(told);
  // Gone altogether: recomputed as well.
  fs::remove_all(dir());
  auto fresh = open(dir());
  EXPECT_TRUE(same_output(fresh->run(r), cold));
}

TEST_F(EngineState, AnotherModelNeverUsesTheState) {
  // Two sessions of the first model: one to continue, one to extend.
  {
    auto first = open(dir());
    Request r = request2(prompt_of(50, 4), 3, 8);
    r.session = "s";
    first->run(r);
    r.session = "t";
    first->run(r);
  }
  // Another model (another type of the same shape): nothing of the first is used.
  auto other = open(dir(), "", model_file("tiny", DType::Q4_K));
  // Continuing one (no prompt) is where a model change shows: refused,
  // saying why; logged, counted.
  const Request resume_it = continuation("s", 4);
  const std::string why = refusal(*other, resume_it, "another model's session was continued");
  EXPECT_NE(why.find("saved by another model"), std::string::npos) << why;
  Request cont = continuation("t", 4);
  cont.prompt_ids = {1, 5, 6};
  const Response got = other->run(cont);
  EXPECT_FALSE(got.session_found);
  EXPECT_EQ(got.prompt_ids, (std::vector<TokenId>{1, 5, 6})) << "another model's session used";
  other->drain();
  EXPECT_EQ(other->stats().blocks_restored, 0);
  EXPECT_EQ(other->stats().state_fallbacks, 1) << "the model change was not counted";
  bool told = false;
  for (const std::string& l : logged()) told |= l.find("another model") != std::string::npos;
  EXPECT_TRUE(told);
}

// State computed under the kernels' first canonical order (v1: SIMD lanes
// along K) is another system fingerprint: a session record of a v1 engine
// (here: this engine's own record, filed under the fingerprint with
// canonical_order 1, as a v1 build wrote it) is never continued; the
// refusal is logged and counted. The same record under this engine's
// fingerprint is used, so it is the order alone that refuses it.
TEST_F(EngineState, StateOfTheFirstCanonicalOrderIsNeverUsed) {
  std::string fp, fp_v1, record;
  {
    auto e = open(dir());
    fp = e->info().system_fingerprint;
    NumericsSettings v1 = e->info().numerics;
    ASSERT_EQ(v1.canonical_order, 2);
    v1.canonical_order = 1;
    fp_v1 = system_fingerprint(e->info().model_fingerprint, v1);
    Request r = request2(prompt_of(20, 12), 3, 4);
    r.session = "s";
    e->run(r);
  }
  ASSERT_NE(fp_v1, fp);
  {
    DiskStoreOptions d;
    d.dir = dir();
    record = open_disk_store(d)->get({fp, "", "session/s"}).value();
  }
  std::string v1_record = record;
  v1_record.replace(v1_record.find(fp), fp.size(), fp_v1);
  const std::string v1_dir = dir() + "/v1", same_dir = dir() + "/same";
  for (const auto& [where, key_fp, text] :
       {std::tuple{v1_dir, fp_v1, v1_record}, std::tuple{same_dir, fp, record}}) {
    DiskStoreOptions d;
    d.dir = where;
    open_disk_store(d)->put({key_fp, "", "session/s"}, text, std::chrono::milliseconds(0));
  }
  auto e = open(v1_dir);
  const std::string why = refusal(*e, continuation("s", 3), "a v1 session was continued");
  EXPECT_NE(why.find("saved by another model"), std::string::npos) << why;
  EXPECT_NE(why.find(fp_v1), std::string::npos) << why;
  e->drain();
  EXPECT_EQ(e->stats().state_fallbacks, 1);
  auto control = open(same_dir);
  const Response same = control->run(continuation("s", 3));
  EXPECT_EQ(same.status, Response::Status::Ok) << same.error;
  EXPECT_TRUE(same.session_found) << "the control record was not used";
  bool told = false;
  for (const std::string& l : logged()) told |= l.find(fp_v1) != std::string::npos;
  EXPECT_TRUE(told) << "the v1 fingerprint was not logged";
}

// A tier whose writes wait until the test opens it; reads see only what
// was written.
class GatedTier : public StoreTier {
 public:
  std::string_view name() const override { return "gated"; }
  std::optional<std::string> get(const StoreKey& key, uint64_t* expires_ms,
                                 std::optional<StoreMiss>*) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (expires_ms != nullptr) *expires_ms = 0;
    for (const auto& [k, v] : records_) {
      if (k == key) return v;
    }
    return std::nullopt;
  }
  void put(const StoreKey& key, std::string_view payload, std::chrono::milliseconds) override {
    std::unique_lock<std::mutex> lock(mu_);
    opened_.wait(lock, [&] { return open_; });
    records_.emplace_back(key, std::string(payload));
  }
  bool remove(const StoreKey&) override { return false; }
  std::vector<std::string> elsewhere(const StoreKey&) override { return {}; }
  StoreCounters counters() const override { return {}; }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    opened_.notify_all();
  }
  size_t written() const {
    std::lock_guard<std::mutex> lock(mu_);
    return records_.size();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable opened_;
  bool open_ = false;
  std::vector<std::pair<StoreKey, std::string>> records_;
};

// Read your own writes: a session record still waiting for its tier is
// served from the write queue (a continuation sent the moment its answer
// arrives finds it), and only to its own tenant.
TEST_F(EngineState, ASessionRecordStillQueuedIsReadFromTheQueue) {
  Request r = request2(prompt_of(30, 2), 3, 4);
  const Response resp = open("")->run(r);
  const RunState state = run_state_after(r, resp, "fp", 256);
  auto owned = std::make_unique<GatedTier>();
  GatedTier* tier = owned.get();
  std::vector<std::unique_ptr<StoreTier>> tiers;
  tiers.push_back(std::move(owned));
  KvBlockPool pool(KvLayout{1, 1, 8, 16, DType::F32}, 1 << 20);
  Persistence p(std::make_unique<TieredStore>(std::move(tiers)), "fp", pool,
                std::chrono::milliseconds(0), {});
  struct Opener {  // destroyed before p, whose destructor waits for the writes
    GatedTier* t;
    ~Opener() { t->open(); }
  } opener{tier};
  p.save_session("alice", "s", state);
  const std::optional<RunState> got = p.load_session("alice", "s", false).state;
  ASSERT_TRUE(got.has_value()) << "a session record still queued was not seen";
  EXPECT_GT(got->saved_ms, 0u) << "saved records carry their write time";
  RunState stamped = state;
  stamped.saved_ms = got->saved_ms;
  EXPECT_EQ(run_state_json(*got), run_state_json(stamped));
  EXPECT_FALSE(p.load_session("bob", "s", false).state.has_value()) << "another tenant's record";
  EXPECT_EQ(tier->written(), 0u);
  tier->open();
  p.flush();
  EXPECT_EQ(tier->written(), 1u);
  EXPECT_TRUE(p.load_session("alice", "s", false).state.has_value());  // now from the tier
}

TEST_F(EngineState, TenantsNeverSeeEachOthersState) {
  Request a = request2(prompt_of(50, 5), 3, 8);
  a.session = "same-name";
  a.tenant = "alice";
  open(dir())->run(a);
  auto e = open(dir());
  Request b = a;
  b.tenant = "bob";
  const Response got = e->run(b);
  EXPECT_FALSE(got.session_found);
  EXPECT_EQ(got.usage.cached_tokens, 0);
  e->drain();
  EXPECT_EQ(e->stats().blocks_restored, 0);
  EXPECT_EQ(e->stats().sessions_loaded, 0);
}

std::string block_record_name(const BlockHash& h) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "block/%016llx%016llx", static_cast<unsigned long long>(h.hi),
                static_cast<unsigned long long>(h.lo));
  return buf;
}

// A record that passes every checksum but holds another block (planted under
// the right name, as a compromised tier could) is refused by the block's own
// checks (token ids, parent, layout) and recomputed.
TEST_F(EngineState, AWellFormedRecordWithTheWrongBlockIsRefused) {
  Request a = request2(prompt_of(40, 10), 3, 4), b = request2(prompt_of(40, 11), 3, 4);
  a.persist = true;
  std::string fp;
  Response want_b;
  {
    auto e = open(dir());
    fp = e->info().system_fingerprint;
    e->run(a);
    want_b = open("")->run(b);
  }
  const BlockHash root = prefix_root(fp, "");
  const std::vector<TokenId> pa = prompt_of(40, 10), pb = prompt_of(40, 11);
  const BlockHash ha = block_hash(root, std::span<const TokenId>(pa).first(16));
  const BlockHash hb = block_hash(root, std::span<const TokenId>(pb).first(16));
  DiskStoreOptions d;
  d.dir = dir();
  auto disk = open_disk_store(d);
  const std::optional<std::string> a_block = disk->get({fp, "", block_record_name(ha)});
  ASSERT_TRUE(a_block.has_value());
  disk->put({fp, "", block_record_name(hb)}, *a_block, std::chrono::milliseconds(0));
  auto e = open(dir());
  EXPECT_TRUE(same_output(e->run(b), want_b));
  e->drain();
  EXPECT_EQ(e->stats().blocks_restored, 0);
  EXPECT_EQ(e->stats().state_fallbacks, 1);
  bool told = false;
  for (const std::string& l : logged()) told |= l.find("other token ids") != std::string::npos;
  EXPECT_TRUE(told);
}

// Session records are requests from outside: one that does not parse, says
// n = 0, or carries another fingerprint inside is a fallback, never a crash
// or a wrong continuation.
TEST_F(EngineState, BadSessionRecordsAreFallbacks) {
  std::string fp;
  {
    auto e = open(dir());
    fp = e->info().system_fingerprint;
    Request r = request2(prompt_of(20, 12), 3, 4);
    r.session = "good";
    e->run(r);
  }
  DiskStoreOptions d;
  d.dir = dir();
  auto disk = open_disk_store(d);
  const std::string good = disk->get({fp, "", "session/good"}).value();
  auto plant = [&](const std::string& name, std::string text) {
    disk->put({fp, "", "session/" + name}, text, std::chrono::milliseconds(0));
  };
  std::string n0 = good;
  n0.replace(n0.find("\"n\": 2"), 7, "\"n\": 0");
  plant("n0", n0);
  std::string other_fp = good;
  other_fp.replace(other_fp.find(fp), fp.size(), "fp_00000000000000000000000000000000");
  plant("otherfp", other_fp);
  plant("garbage", "{\"format\": 1}");
  auto e = open(dir());
  for (const char* name : {"n0", "otherfp", "garbage"}) {
    Request cont = continuation(name, 3);
    // Nothing to continue: refused, saying the record is unusable (not absent).
    const std::string why = refusal(*e, cont, std::string(name) + ": continued");
    EXPECT_EQ(why.rfind("session: the saved session", 0), 0) << why;
    EXPECT_NE(why.find("cannot be used"), std::string::npos) << why;
    // With a prompt the session starts afresh.
    cont.prompt_ids = {1, 7, 8};
    const Response got = e->run(cont);
    EXPECT_EQ(got.status, Response::Status::Ok) << name;
    EXPECT_FALSE(got.session_found) << name;
    EXPECT_EQ(got.prompt_ids, cont.prompt_ids) << name;
  }
  e->drain();
  EXPECT_EQ(e->stats().state_fallbacks, 6);
  EXPECT_EQ(e->stats().sessions_loaded, 0);
}

TEST_F(EngineState, AContinuationUnderAnotherContextSizeIsRefused) {
  {
    Request r = request2(prompt_of(20, 13), 3, 4);
    r.session = "ctx";
    open(dir())->run(r);
  }
  EngineOptions o;
  o.n_ctx = 128;  // the session ran with 256
  o.kv_bytes = 8 << 20;
  o.state_dir = dir();
  o.fingerprint_cache_dir = "/nonexistent";
  auto e = Engine::open(*file_, o);
  Request cont;
  cont.session = "ctx";
  try {
    e->submit(cont);
    FAIL() << "continued under another context size";
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("context size 256"), std::string::npos) << err.what();
  }
}

// A continuation without a prompt needs the saved session: when there is
// none it fails at submit with NotFound ("session: no saved session ..."),
// also for another tenant's session of the same name. A prompt starts the
// session instead (session_found false), and then it continues (true).
TEST_F(EngineState, AMissingSessionWithoutAPromptIsNotFound) {
  auto e = open(dir());
  Request cont = continuation("never-saved", 3);
  EXPECT_EQ(refusal(*e, cont, "a session that was never saved was continued"),
            "session: no saved session 'never-saved' for this tenant (expired, removed, or never "
            "saved); send a prompt to start it");
  Request start = request2(prompt_of(20, 14), 3, 4);
  start.session = "never-saved";
  start.tenant = "alice";
  const Response started = e->run(start);
  EXPECT_FALSE(started.session_found);
  cont.tenant = "bob";
  EXPECT_THROW(e->submit(cont), NotFound) << "bob continued alice's session";
  cont.tenant = "alice";
  const Response continued = e->run(cont);
  EXPECT_TRUE(continued.session_found);
  EXPECT_EQ(continued.seed, 3u);
  Request more = request2({40, 41}, 4, 4);
  more.session = "never-saved";
  more.tenant = "alice";
  EXPECT_TRUE(e->run(more).session_found);
}

// A saved session whose KV blocks are gone is still there: it continues
// exactly (the KV recomputed). One whose record is damaged is not: refused,
// saying the record is unusable; once removed, it is not found.
TEST_F(EngineState, ASessionWithoutItsBlocksContinuesADamagedOneIsRefused) {
  const Request whole = request2(prompt_of(40, 15), 8, 20);
  const Response want = open("")->run(whole);
  const Request first = first_part(whole, 8, "kept");
  const Response a = open(dir())->run(first);
  size_t blocks = 0;
  std::string session_file;
  for (const DiskRecord& d : list_disk_records(dir(), false)) {
    if (d.key.name.rfind("block/", 0) == 0) blocks += fs::remove(d.path) ? 1 : 0;
    if (d.key.name == "session/kept") session_file = d.path;
  }
  ASSERT_GT(blocks, 0u);
  ASSERT_FALSE(session_file.empty());
  const std::string good = test::read_file(session_file);
  const Request rest = continuation("kept", 12);
  {
    auto e = open(dir());
    const Response b = e->run(rest);
    ASSERT_EQ(b.status, Response::Status::Ok) << b.error;
    EXPECT_TRUE(b.session_found);
    expect_continues(a, b, want);
    e->drain();
    EXPECT_EQ(e->stats().blocks_restored, 0);
  }
  std::string bad = good;
  bad[bad.size() - 3] ^= 0x10;
  std::ofstream(session_file, std::ios::binary | std::ios::trunc) << bad;
  auto e = open(dir());
  EXPECT_EQ(refusal(*e, rest, "a damaged session record was continued"),
            "session: the saved session 'kept' cannot be used (its record is corrupt); send a "
            "prompt to start it afresh");
  bool told = false;
  for (const std::string& l : logged()) {
    told |= l.find("session/kept: corrupt") != std::string::npos &&
            l.find("treated as absent") != std::string::npos;
    EXPECT_EQ(l.find("will be recomputed"), std::string::npos) << "a session is not recomputed";
  }
  EXPECT_TRUE(told);
  // The disk tier removed the damaged record: now there is none.
  const std::string why = refusal(*e, rest, "continued");
  EXPECT_NE(why.find("no saved session 'kept'"), std::string::npos) << why;
}

// Tenant A, with a share of the state directory, writes far more than the
// directory's size cap holds; B, without a share, saved a session before.
// A's own oldest records make room, B's session survives (without the
// share, the size cap would have taken it: the least recently used of all),
// and A stays within its share.
TEST_F(EngineState, ATenantsShareKeepsItsWritesFromEvictingAnothersSession) {
  EngineOptions o = options(dir());
  o.state_max_bytes = 1 << 20;
  o.tenant_shares.bytes["alice"] = 256 << 10;
  auto e = Engine::open(*file_, o);
  Request b = request(prompt_of(40, 20), 3, 8);
  b.session = "bobs";
  b.tenant = "bob";
  const Response b1 = e->run(b);
  e->drain();
  for (int i = 0; i < 30; ++i) {
    Request a = request(prompt_of(70, 30 + i), 4, 10);
    a.persist = true;
    a.tenant = "alice";
    e->run(a);
  }
  e->drain();
  uint64_t alice = 0, total = 0;
  for (const DiskRecord& d : list_disk_records(dir(), false)) {
    total += d.file_bytes;
    if (d.key.tenant == "alice") alice += d.file_bytes;
  }
  EXPECT_LE(alice, 256u << 10);
  EXPECT_LE(total, 1u << 20);
  const StoreCounters disk = e->state_counters().at(0).second;
  EXPECT_GT(disk.share_evictions, 0);
  EXPECT_EQ(disk.evictions, 0) << "the size cap had to step in";
  Request cont = continuation("bobs", 4);
  cont.tenant = "bob";
  const Response b2 = e->run(cont);  // NotFound if alice's writes evicted it
  EXPECT_TRUE(b2.session_found);
  // A share of nothing is not a share.
  o.tenant_shares.bytes["carol"] = 0;
  EXPECT_THROW(Engine::open(*file_, o), InvalidArgument);
}

class EngineRedis : public EngineState {
 protected:
  test::RedisServer redis_;
};

TEST_F(EngineRedis, TwoEnginesShareOneRedis) {
  const Request whole = request2(prompt_of(45, 6), 21, 30);
  const Response want = open("")->run(whole);
  const Request first = first_part(whole, 12, "shared");
  Response a;
  {
    auto e1 = open("", redis_.url());
    a = e1->run(first);
  }
  auto e2 = open("", redis_.url());  // another "process": nothing in RAM
  const Request rest = continuation("shared", 18);
  const Response b = e2->run(rest);
  ASSERT_TRUE(b.session_found);
  expect_continues(a, b, want);
  e2->drain();
  EXPECT_GT(e2->stats().blocks_restored_redis, 0);
}

// End to end through Redis with its writes held back (for less than the
// store's 500 ms command timeout, so they succeed after): a continuation
// sent the moment its answer arrives finds its session and continues
// exactly. (ASessionRecordStillQueuedIsReadFromTheQueue pins the queue read
// itself deterministically.)
TEST_F(EngineRedis, AContinuationRightAfterItsAnswerFindsTheQueuedSession) {
  const Request whole = request2(prompt_of(45, 8), 5, 14);
  const Response want = open("")->run(whole);
  auto e = open("", redis_.url());
  Request warm = request(prompt_of(20, 9), 1, 2);  // engine and Redis connection in use
  warm.session = "warm";
  e->run(warm);
  ASSERT_EQ(redis_.cli("CLIENT PAUSE 400 WRITE"), "OK\n");
  const Request first = first_part(whole, 6, "quick");
  const Response a = e->run(first);
  const Request rest = continuation("quick", 8);
  const Response b = e->run(rest);
  ASSERT_TRUE(b.session_found) << "the session record still queued was not seen";
  expect_continues(a, b, want);
  e->drain();
  EXPECT_EQ(e->stats().state_fallbacks, 0);
}

TEST_F(EngineRedis, RedisFlushedOrDownBetweenTurnsStillGivesTheSameOutput) {
  Request r = request2(prompt_of(60, 7), 4, 10);
  r.persist = true;
  const Response cold = open("")->run(r);
  open("", redis_.url())->run(r);
  redis_.cli("FLUSHALL");
  EXPECT_TRUE(same_output(open("", redis_.url())->run(r), cold));
  redis_.stop();
  auto e = open(dir(), redis_.url());  // disk + an unreachable Redis
  EXPECT_TRUE(same_output(e->run(r), cold));
  e->drain();
  EXPECT_GT(e->stats().state_write_errors, 0) << "the outage went unnoticed";
  bool told = false;
  for (const std::string& l : logged()) told |= l.find("retrying") != std::string::npos;
  EXPECT_TRUE(told);
  redis_.start();
  EXPECT_TRUE(same_output(e->run(r), cold));
}

TEST_F(EngineRedis, TenantIsolationHoldsInRedisKeys) {
  Request a = request2(prompt_of(50, 8), 3, 8);
  a.session = "same-name";
  a.tenant = "alice";
  {
    auto e = open("", redis_.url());
    e->run(a);
    e->drain();
  }
  const std::string alice_keys = redis_.cli("--scan --pattern 'encore:v1:*'");
  auto e = open("", redis_.url());
  Request b = a;
  b.tenant = "bob";
  const Response got = e->run(b);
  e->drain();
  EXPECT_FALSE(got.session_found);
  EXPECT_EQ(got.usage.cached_tokens, 0);
  EXPECT_EQ(e->stats().blocks_restored, 0);
  EXPECT_EQ(e->stats().sessions_loaded, 0);
  const std::string all_keys = redis_.cli("--scan --pattern 'encore:v1:*'");
  // Bob's run wrote its own keys; none of them is one of Alice's.
  size_t bob_keys = 0;
  for (size_t at = 0, nl; (nl = all_keys.find('\n', at)) != std::string::npos; at = nl + 1) {
    const std::string key = all_keys.substr(at, nl - at);
    if (alice_keys.find(key + "\n") == std::string::npos) ++bob_keys;
  }
  EXPECT_GT(bob_keys, 0u) << all_keys;
  EXPECT_EQ(std::count(all_keys.begin(), all_keys.end(), '\n'),
            std::count(alice_keys.begin(), alice_keys.end(), '\n') + static_cast<long>(bob_keys));
}

TEST_F(EngineRedis, ExpiredStateIsGoneFromEveryTier) {
  EngineOptions o = options(dir(), redis_.url());
  o.state_ttl = std::chrono::milliseconds(150);
  Request r = request2(prompt_of(50, 9), 3, 8);
  r.session = "brief";
  {
    auto e = Engine::open(*file_, o);
    e->run(r);
    e->drain();
  }
  EXPECT_NE(redis_.cli("--scan --pattern 'encore:v1:*'"), "");
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ(redis_.cli("--scan --pattern 'encore:v1:*'"), "") << "Redis kept expired keys (PX)";
  auto e = Engine::open(*file_, o);
  Request cont = continuation("brief", 2);
  EXPECT_THROW(e->submit(cont), NotFound) << "an expired session was used";
  cont.prompt_ids = {1, 2, 3};
  EXPECT_FALSE(e->run(cont).session_found) << "an expired session was used";
  e->drain();
  EXPECT_EQ(e->stats().blocks_restored, 0);
  // On disk, a lookup removes what it finds expired; collection removes the rest.
  size_t expired = 0;
  for (const DiskRecord& d : list_disk_records(dir(), false)) {
    expired += d.problem == StoreMiss::Expired ? 1 : 0;
  }
  EXPECT_GT(expired, 0u);
  EXPECT_EQ(collect_disk_garbage(dir(), 1ull << 30).removed, static_cast<int64_t>(expired));
  for (const DiskRecord& d : list_disk_records(dir(), false)) {
    EXPECT_FALSE(d.problem.has_value()) << d.key.name;  // only what the last run wrote
  }
}

}  // namespace
}  // namespace encore
