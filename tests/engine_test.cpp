// The engine (engine.h) on a synthetic tiny model: finish reasons, field
// errors at submission, streaming events, the scheduler (a crowd, late
// arrivals, preemption), the prefix cache (hits bit-identical to cold runs,
// tenants apart, eviction), cancellation from another thread, failures, and
// KV block accounting after every path. Label `unit`: also run under
// ASan+UBSan.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "encore/engine.h"
#include "encore/error.h"
#include "encore/gguf.h"
#include "engine_test_util.h"
#include "synth_test_util.h"

namespace encore {
namespace {

struct EngineSpec {
  int32_t n_ctx = 128;
  int32_t kv_blocks = 64;  // of 16 tokens
  int32_t batch_tokens = 512;
  bool prefix_cache = true;
  int threads = 2;
};

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    file_ = new std::shared_ptr<const gguf::File>(std::make_shared<const gguf::File>(
        gguf::File::from_bytes(test::synth_bytes("tiny", DType::Q8_0), "tiny.gguf")));
    EngineOptions o;
    o.kv_bytes = 1 << 20;
    o.fingerprint_cache_dir = "/nonexistent";  // never touch the user's cache
    block_bytes_ = Engine::open(*file_, o)->info().kv_block_bytes;
  }
  static void TearDownTestSuite() { delete file_; }

  // Every engine a test made must hold no KV block once its requests are over.
  void TearDown() override {
    for (const auto& e : engines_) {
      e->drain();
      const EngineStats s = e->stats();
      EXPECT_EQ(s.kv_blocks_used, 0) << "KV blocks leaked";
      EXPECT_EQ(s.kv_blocks_used + s.kv_blocks_cached + s.kv_blocks_free, s.kv_blocks_total);
      EXPECT_EQ(s.requests_running + s.requests_waiting, 0);
    }
  }

  Engine& engine(const EngineSpec& spec = {}) {
    EngineOptions o;
    o.threads = spec.threads;
    o.n_ctx = spec.n_ctx;
    o.kv_bytes = static_cast<uint64_t>(spec.kv_blocks) * block_bytes_;
    o.batch_tokens = spec.batch_tokens;
    o.prefix_cache = spec.prefix_cache;
    o.fingerprint_cache_dir = "/nonexistent";
    engines_.push_back(Engine::open(*file_, o));
    return *engines_.back();
  }

  static std::shared_ptr<const gguf::File>* file_;
  static uint64_t block_bytes_;
  std::vector<std::unique_ptr<Engine>> engines_;
};
std::shared_ptr<const gguf::File>* EngineTest::file_ = nullptr;
uint64_t EngineTest::block_bytes_ = 0;

// ---- One request ----------------------------------------------------------------

TEST_F(EngineTest, LengthStopsAtMaxTokensAndStreamsEveryToken) {
  Engine& e = engine();
  Request r = request(prompt_of(4, 0), 5, 9);
  r.stream = true;
  RequestHandle h = e.submit(r);
  std::vector<TokenId> ids;
  std::string text;
  int finishes = 0, dones = 0;
  while (std::optional<Event> ev = h.next()) {
    if (ev->kind == Event::Kind::Token) {
      ids.push_back(ev->id);
      ASSERT_TRUE(ev->logprob.has_value());
      EXPECT_EQ(ev->logprob->chosen.id, ev->id);
    }
    if (ev->kind == Event::Kind::Finish) ++finishes;
    if (ev->kind == Event::Kind::Done) ++dones;
    text += ev->text;
  }
  const Response& resp = h.wait();
  ASSERT_EQ(resp.samples.size(), 1u);
  EXPECT_EQ(resp.samples[0].finish, FinishReason::Length);
  EXPECT_EQ(resp.samples[0].ids.size(), 9u);
  EXPECT_EQ(ids, resp.samples[0].ids);
  EXPECT_EQ(text, resp.samples[0].text);
  EXPECT_EQ(finishes, 1);
  EXPECT_EQ(dones, 1);
  EXPECT_EQ(resp.seed, 5u);
  EXPECT_EQ(resp.usage.prompt_tokens, 4);
  EXPECT_EQ(resp.usage.generated_tokens, 9);
}

TEST_F(EngineTest, ContextFullStops) {
  Engine& e = engine({.n_ctx = 20, .kv_blocks = 2});
  Request r = request(prompt_of(4, 0), 1, -1);
  r.sampling.temp = 0.0f;
  const Response resp = e.run(r);
  EXPECT_EQ(resp.samples[0].finish, FinishReason::Context);
  EXPECT_EQ(4 + resp.samples[0].ids.size(), 21u);  // 20 positions in the KV + the last pick
}

TEST_F(EngineTest, EogStopsAndIsNotEmittedUnlessIgnored) {
  // Some seed among the first 200 samples EOS within 300 tokens on this
  // random model (p(EOS) is about 1/512 per step); the search is deterministic.
  Engine& e = engine({.n_ctx = 512, .kv_blocks = 64});
  for (uint64_t seed = 0; seed < 200; ++seed) {
    Request r = request(prompt_of(4, 0), seed, 300);
    r.sampling.temp = 1.5f;
    r.logprobs = -1;
    const Response a = e.run(r);
    if (a.samples[0].finish != FinishReason::Eog) continue;
    const size_t n = a.samples[0].ids.size();
    // With ignore_eos the same draws go on past the EOG token.
    r.ignore_eos = true;
    r.max_tokens = static_cast<int32_t>(n + 3);
    const Response b = e.run(r);
    EXPECT_EQ(b.samples[0].finish, FinishReason::Length);
    ASSERT_EQ(b.samples[0].ids.size(), n + 3);
    EXPECT_TRUE(
        std::equal(a.samples[0].ids.begin(), a.samples[0].ids.end(), b.samples[0].ids.begin()));
    EXPECT_EQ(b.samples[0].ids[n], 2) << "the EOS id of the built-in vocabulary";
    return;
  }
  FAIL() << "no seed reached EOS; the synthetic model's logits may be degenerate";
}

TEST_F(EngineTest, SameSeedSameOutputOtherSeedOtherOutput) {
  Engine& e = engine();
  const Response a = e.run(request(prompt_of(4, 0), 77, 24));
  EXPECT_TRUE(same_output(a, e.run(request(prompt_of(4, 0), 77, 24))));
  EXPECT_NE(a.samples[0].ids, e.run(request(prompt_of(4, 0), 78, 24)).samples[0].ids);
}

TEST_F(EngineTest, SeedlessRequestsDrawAndReportTheirSeed) {
  Engine& e = engine();
  Request r = request(prompt_of(4, 0), 0, 16);
  r.seed.reset();
  const Response a = e.run(r), b = e.run(r);
  EXPECT_NE(a.seed, b.seed);
  EXPECT_NE(a.samples[0].ids, b.samples[0].ids);
  r.seed = a.seed;
  EXPECT_TRUE(same_output(a, e.run(r)));
  EXPECT_EQ(e.stats().seeds_drawn, 2);
}

TEST_F(EngineTest, BadFieldsAreRefusedAtSubmissionNamingTheField) {
  Engine& e = engine({.n_ctx = 64, .kv_blocks = 16});
  struct Case {
    std::string field;
    std::function<void(Request&)> edit;
  };
  const std::vector<Case> cases = {
      {"n", [](Request& r) { r.n = 0; }},
      {"n", [](Request& r) { r.n = kMaxSamples + 1; }},
      {"max_tokens", [](Request& r) { r.max_tokens = -2; }},
      {"logprobs", [](Request& r) { r.logprobs = kMaxTopLogprobs + 1; }},
      {"stop[0]", [](Request& r) { r.stop = {""}; }},
      {"stop[1]",
       [](Request& r) {
         r.stop = {"a", "\xff"};
       }},
      {"stop", [](Request& r) { r.stop.assign(kMaxStopStrings + 1, "x"); }},
      {"temperature", [](Request& r) { r.sampling.temp = -1; }},
      {"logit_bias",
       [](Request& r) {
         r.sampling.logit_bias = {{99999, 1.0f}};
       }},
      {"prompt_ids[2]", [](Request& r) { r.prompt_ids[2] = 512; }},
      {"prompt_ids[0]", [](Request& r) { r.prompt_ids[0] = -1; }},
      {"prompt", [](Request& r) { r.prompt = "text too"; }},
      {"prompt", [](Request& r) { r.prompt_ids.assign(65, 5); }},
      {"messages",
       [](Request& r) {
         r.prompt_ids.clear();
         r.chat_template = "chatml";
       }},
      {"messages[1].role",
       [](Request& r) {
         r.prompt_ids.clear();
         r.messages = {{"user", "Hi"}, {"user\nassistant", "x"}};
         r.chat_template = "chatml";
       }},
      {"parse_special",  // message content is always plain text
       [](Request& r) {
         r.prompt_ids.clear();
         r.messages = {{"user", "</s>"}};
         r.chat_template = "chatml";
         r.parse_special = true;
       }},
      {"tenant", [](Request& r) { r.tenant.assign(kMaxTenantBytes + 1, 't'); }},
      {"resume", [](Request& r) { r.resume.resize(2); }},
  };
  for (const Case& c : cases) {
    Request r = request(prompt_of(4, 0), 1, 8);
    c.edit(r);
    try {
      e.submit(r);
      ADD_FAILURE() << c.field << ": accepted";
    } catch (const InvalidArgument& err) {
      EXPECT_EQ(err.field(), c.field) << err.what();
      EXPECT_EQ(std::string(err.what()).rfind(c.field, 0), 0u)
          << "the error should start with the field " << c.field << ": " << err.what();
    }
  }
  EXPECT_EQ(e.stats().requests_submitted, 0);
}

// A logit bias that bans (-inf) every token leaves nothing to sample: refused
// at submission as a logit bias error (the server's param "logit_bias"). With
// one token left, even among as many entries as the vocabulary (one id
// repeated), only that token comes out; a finite -100 on every token is a
// shift, not a ban, and runs.
TEST_F(EngineTest, ALogitBiasThatBansEveryTokenIsRefused) {
  Engine& e = engine({.n_ctx = 64, .kv_blocks = 16});
  const int n_vocab = e.info().n_vocab;
  constexpr float kBan = -std::numeric_limits<float>::infinity();
  Request all = request(prompt_of(4, 0), 1, 6);
  all.ignore_eos = true;
  for (TokenId id = 0; id < n_vocab; ++id) all.sampling.logit_bias.emplace_back(id, kBan);
  try {
    e.submit(all);
    ADD_FAILURE() << "a logit bias banning all " << n_vocab << " tokens was accepted";
  } catch (const InvalidArgument& err) {
    const std::string what = err.what();
    EXPECT_TRUE(what.starts_with("logit_bias: the logit bias bans every token")) << what;
    EXPECT_EQ(err.field(), "logit_bias");
  }
  EXPECT_EQ(e.stats().requests_submitted, 0);

  const TokenId kept = 7;
  Request one = all;
  one.sampling.logit_bias[kept] = {kept + 1, kBan};  // n_vocab entries, kept not among them
  const Response r1 = e.run(one);
  ASSERT_EQ(r1.status, Response::Status::Ok) << r1.error;
  EXPECT_EQ(r1.samples[0].ids, std::vector<TokenId>(6, kept));

  Request shifted = all;
  for (auto& entry : shifted.sampling.logit_bias) entry.second = -100.0f;
  const Response r2 = e.run(shifted);
  ASSERT_EQ(r2.status, Response::Status::Ok) << r2.error;
  EXPECT_EQ(r2.samples[0].ids.size(), 6u);
}

// A session id is checked by the one rule (valid_session_id, request.h) and
// quoted clipped: a megabyte of it does not come back in the message.
TEST_F(EngineTest, BadSessionIdsAreRefusedInAShortMessage) {
  Engine& e = engine({.n_ctx = 64, .kv_blocks = 16});
  const std::string longest(kMaxSessionBytes, 's');
  for (const std::string& id :
       {std::string(1 << 20, 'x'), longest + "s", std::string("a b"), std::string("\xff\x1b[2J")}) {
    Request r = request(prompt_of(4, 0), 1, 4);
    r.session = id;
    try {
      e.submit(r);
      ADD_FAILURE() << id.size() << " bytes: accepted";
    } catch (const InvalidArgument& err) {
      const std::string what = err.what();
      EXPECT_TRUE(what.starts_with("session: ")) << what.substr(0, 300);
      EXPECT_NE(what.find(kSessionIdRule), std::string::npos) << what.substr(0, 300);
      EXPECT_LT(what.size(), 300u) << what.substr(0, 300);
      EXPECT_EQ(what.find('\x1b'), std::string::npos) << "control bytes are escaped";
    }
  }
  // The longest valid id passes the check (this engine has no state tiers).
  Request r = request(prompt_of(4, 0), 1, 4);
  r.session = longest;
  try {
    e.submit(r);
    ADD_FAILURE() << "accepted without state tiers";
  } catch (const InvalidArgument& err) {
    EXPECT_NE(std::string(err.what()).find("no state tiers"), std::string::npos) << err.what();
  }
}

// A request that could never fit the KV budget is refused at once; the
// others go on.
TEST_F(EngineTest, ARequestThatCannotFitIsRefusedAndOthersGoOn) {
  Engine& e = engine({.n_ctx = 256, .kv_blocks = 4});
  RequestHandle ok = e.submit(request(prompt_of(4, 0), 1, 20));
  try {
    e.submit(request(prompt_of(4, 0), 2, -1));  // may fill 256 positions: 16 blocks
    FAIL() << "expected ResourceExhausted";
  } catch (const ResourceExhausted& err) {
    EXPECT_NE(std::string(err.what()).find("holds 64 tokens"), std::string::npos) << err.what();
  }
  EXPECT_EQ(ok.wait().status, Response::Status::Ok);
  EXPECT_EQ(ok.wait().samples[0].ids.size(), 20u);
}

TEST_F(EngineTest, TextAndChatPromptsAreTokenizedByTheEngine) {
  Engine& e = engine();
  Request r = request({}, 3, 4);
  r.prompt = "the quick brown fox";
  const Response a = e.run(r);
  ASSERT_GE(a.prompt_ids.size(), 2u);
  EXPECT_EQ(a.prompt_ids[0], 1) << "BOS first";
  Request empty = request({}, 3, 4);
  EXPECT_EQ(e.run(empty).prompt_ids, std::vector<TokenId>{1}) << "an empty prompt is BOS only";
  Request chat = request({}, 3, 4);
  chat.messages = {{"system", "Be brief."}, {"user", "the quick brown fox"}};
  chat.chat_template = "chatml";
  const Response c = e.run(chat);
  EXPECT_EQ(c.chat_template, "chatml");
  EXPECT_GT(c.prompt_ids.size(), a.prompt_ids.size());
}

// ---- The scheduler: crowds, late arrivals, preemption -------------------------------

// A mixed crowd: prompts of several lengths sharing prefixes, n up to 4,
// several sampler settings and stop strings.
std::vector<Request> crowd(int count) {
  std::vector<Request> v;
  for (int k = 0; k < count; ++k) {
    std::vector<TokenId> p = prompt_of(3 + (k * 13) % 45, k % 3);  // shared starts per salt
    Request r = request(std::move(p), 1000 + static_cast<uint64_t>(k), 6 + (k * 7) % 20);
    r.n = 1 + k % 4;
    if (k % 3 == 1) {
      r.sampling.temp = 0.7f;
      r.sampling.top_k = 20;
      r.sampling.repeat_penalty = 1.2f;
    }
    if (k % 5 == 2) r.stop = {"e", "th"};
    if (k % 4 == 3) r.logprobs = -1;
    v.push_back(std::move(r));
  }
  return v;
}

TEST_F(EngineTest, ACrowdGivesEachRequestItsOutputAlone) {
  const std::vector<Request> reqs = crowd(24);
  Engine& alone = engine({.n_ctx = 128, .kv_blocks = 64, .prefix_cache = false});
  std::vector<Response> want;
  for (const Request& r : reqs) want.push_back(alone.run(r));
  // All at once, with small steps (prefill chunks of a few tokens), another
  // thread count and the prefix cache on; a third of them arrive late.
  Engine& e = engine({.n_ctx = 128, .kv_blocks = 256, .batch_tokens = 7, .threads = 3});
  std::vector<RequestHandle> handles;
  for (size_t k = 0; k < reqs.size(); ++k) {
    if (k == 16) e.run(request(prompt_of(30, 9), 5, 10));  // the first ones are running by now
    handles.push_back(e.submit(reqs[k]));
  }
  for (size_t k = 0; k < reqs.size(); ++k) {
    EXPECT_TRUE(same_output(handles[k].wait(), want[k])) << "request " << k;
  }
  EXPECT_GT(e.stats().steps, 30);
}

TEST_F(EngineTest, PreemptedRequestsGiveTheSameOutput) {
  const std::vector<Request> reqs = crowd(16);
  Engine& alone = engine({.n_ctx = 128, .kv_blocks = 64});
  std::vector<Response> want;
  for (const Request& r : reqs) want.push_back(alone.run(r));
  // A pool that holds about one large request: the scheduler must preempt.
  for (bool cache : {true, false}) {
    Engine& e = engine({.n_ctx = 128, .kv_blocks = 14, .batch_tokens = 32, .prefix_cache = cache});
    std::vector<RequestHandle> handles;
    for (const Request& r : reqs) handles.push_back(e.submit(r));
    int preempted = 0;
    for (size_t k = 0; k < reqs.size(); ++k) {
      const Response& got = handles[k].wait();
      EXPECT_TRUE(same_output(got, want[k])) << "request " << k << ", cache " << cache;
      preempted += got.preemptions > 0 ? 1 : 0;
    }
    e.drain();
    EXPECT_GT(e.stats().preemptions, 0) << "the test no longer preempts; shrink the pool";
    EXPECT_GT(preempted, 0);
  }
}

// ---- Prefix cache --------------------------------------------------------------------

TEST_F(EngineTest, PrefixCacheHitsAreBitIdenticalToColdRuns) {
  Engine& cold = engine({.n_ctx = 128, .kv_blocks = 64, .prefix_cache = false});
  Engine& e = engine({.n_ctx = 128, .kv_blocks = 64});
  const std::vector<TokenId> shared = prompt_of(40, 4);  // 2 full blocks + 8
  std::vector<TokenId> a = shared, b = shared;
  a.insert(a.end(), {10, 11, 12});
  b.insert(b.end(), {20, 21, 22, 23, 24});
  Request ra = request(a, 7, 12), rb = request(b, 8, 12);
  rb.n = 3;
  const Response first = e.run(ra);
  EXPECT_EQ(first.usage.cached_tokens, 0);
  const Response second = e.run(rb);
  EXPECT_EQ(second.usage.cached_tokens, 32) << "two full blocks of the shared prefix";
  EXPECT_TRUE(same_output(second, cold.run(rb)));
  // The same prompt again: its own blocks, and generated blocks are cached too.
  const Response again = e.run(ra);
  EXPECT_EQ(again.usage.cached_tokens, 32);
  EXPECT_TRUE(same_output(again, first));
  // A prompt that is the first one plus what it generated continues from the cache.
  std::vector<TokenId> cont = a;
  cont.insert(cont.end(), first.samples[0].ids.begin(), first.samples[0].ids.end());
  const Response c = e.run(request(cont, 9, 5));
  EXPECT_EQ(c.usage.cached_tokens, 48);
  EXPECT_TRUE(same_output(c, cold.run(request(cont, 9, 5))));
  e.drain();
  const EngineStats s = e.stats();
  EXPECT_EQ(s.prefix_lookups, 4);
  EXPECT_EQ(s.prefix_hit_blocks, 2 + 2 + 3);
  EXPECT_EQ(s.prefix_hit_tokens, 16 * 7);
  EXPECT_EQ(cold.stats().prefix_hit_blocks, 0);
}

TEST_F(EngineTest, TenantsNeverShareBlocks) {
  Engine& e = engine();
  Request r = request(prompt_of(50, 1), 3, 4);
  r.tenant = "alice";
  e.run(r);
  EXPECT_EQ(e.run(r).usage.cached_tokens, 48);
  r.tenant = "bob";
  const Response bob = e.run(r);
  EXPECT_EQ(bob.usage.cached_tokens, 0) << "bob was served alice's blocks";
  r.tenant = "alice";
  EXPECT_TRUE(same_output(bob, e.run(r))) << "the tenant never changes the output";
}

TEST_F(EngineTest, CachedBlocksAreEvictedLeastRecentlyUsedFirst) {
  Engine& e = engine({.n_ctx = 128, .kv_blocks = 8});
  const std::vector<TokenId> p1 = prompt_of(33, 1), p2 = prompt_of(33, 2);
  for (const auto* p : {&p1, &p2}) e.run(request(*p, 1, 1));  // 2 cached blocks each
  e.run(request(p1, 1, 1));  // p1 used again: p2 is now the least recently used
  EXPECT_EQ(e.stats().prefix_evictions, 0);
  // Needs 3 + 3 blocks beyond the 8 - 4 cached ones' room: evicts.
  const Response big = e.run(request(prompt_of(33, 4), 1, 60));
  EXPECT_EQ(big.status, Response::Status::Ok);
  e.drain();
  EXPECT_GT(e.stats().prefix_evictions, 0);
  EXPECT_EQ(e.run(request(p1, 1, 1)).usage.cached_tokens, 32) << "the recently used stays";
  EXPECT_EQ(e.run(request(p2, 1, 1)).usage.cached_tokens, 0) << "the least recently used went";
}

// ---- Cancellation, failure, shutdown -----------------------------------------------------

TEST_F(EngineTest, CancelFromAnotherThreadMidPrefillAndMidDecodeFreesEverything) {
  // One token per step: a 500-token prompt takes 500 steps.
  Engine& e = engine({.n_ctx = 512, .kv_blocks = 128, .batch_tokens = 1});
  RequestHandle a = e.submit(request(prompt_of(500, 2), 1, 4));
  while (e.stats().tokens_evaluated < 5) std::this_thread::yield();  // prefill has begun
  std::thread([&] { a.cancel(); }).join();
  const Response& ra = a.wait();
  EXPECT_EQ(ra.status, Response::Status::Cancelled);
  EXPECT_EQ(ra.usage.generated_tokens, 0) << "cancelled after its prefill";
  e.drain();
  EXPECT_EQ(e.stats().kv_blocks_used, 0);
  // Mid-decode: cancelled after its first streamed token.
  Request long_gen = request(prompt_of(3, 2), 1, 400);
  long_gen.stream = true;
  RequestHandle b = e.submit(long_gen);
  std::optional<Event> ev = b.next();
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->kind, Event::Kind::Token);
  std::thread([&] { b.cancel(); }).join();
  const Response& rb = b.wait();
  EXPECT_EQ(rb.status, Response::Status::Cancelled);
  EXPECT_GT(rb.usage.generated_tokens, 0);
  EXPECT_LT(rb.usage.generated_tokens, 400);
  // Dropping a handle cancels too.
  { RequestHandle dropped = e.submit(request(prompt_of(3, 3), 1, 400)); }
  e.drain();
  const EngineStats s = e.stats();
  EXPECT_EQ(s.requests_cancelled, 3);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

TEST_F(EngineTest, NanLogitsFailTheRequestAndFreeItsBlocks) {
  const auto bytes = test::with_vectors_set(test::synth_bytes("tiny", DType::F32), "output_norm",
                                            std::numeric_limits<float>::quiet_NaN());
  EngineOptions o;
  o.kv_bytes = 64 * block_bytes_;
  o.fingerprint_cache_dir = "/nonexistent";
  engines_.push_back(Engine::open(
      std::make_shared<const gguf::File>(gguf::File::from_bytes(bytes, "nan.gguf")), o));
  const Response r = engines_.back()->run(request(prompt_of(20, 0), 1, 5));
  EXPECT_EQ(r.status, Response::Status::Failed);
  EXPECT_NE(r.error.find("NaN"), std::string::npos) << r.error;
}

TEST_F(EngineTest, DestroyingTheEngineCancelsWhatIsLeft) {
  std::vector<RequestHandle> handles;
  {
    EngineOptions o;
    o.kv_bytes = 64 * block_bytes_;
    o.fingerprint_cache_dir = "/nonexistent";
    std::unique_ptr<Engine> e = Engine::open(*file_, o);
    for (int k = 0; k < 4; ++k) handles.push_back(e->submit(request(prompt_of(5, k), 1, 300)));
  }
  for (RequestHandle& h : handles) {
    const Response::Status s = h.wait().status;
    EXPECT_TRUE(s == Response::Status::Cancelled || s == Response::Status::Ok);
  }
}

// ---- Resume --------------------------------------------------------------------------------

TEST_F(EngineTest, ResumeContinuesExactlyAndRefusesEditedStates) {
  Engine& e = engine();
  Request r = request(prompt_of(10, 5), 21, 30);
  r.n = 2;
  r.stop = {"zz"};
  const Response full = e.run(r);
  Request first = r;
  first.max_tokens = 12;
  const Response a = e.run(first);
  Request rest = r;
  rest.prompt_ids = a.prompt_ids;
  rest.max_tokens = 18;
  rest.resume = a.states;
  const Response b = e.run(rest);
  for (size_t i = 0; i < 2; ++i) {
    std::vector<TokenId> ids = a.samples[i].ids;
    ids.insert(ids.end(), b.samples[i].ids.begin(), b.samples[i].ids.end());
    EXPECT_EQ(ids, full.samples[i].ids) << "sample " << i;
  }
  rest.resume[1].sampler.t += 1;
  EXPECT_THROW(e.submit(rest), InvalidArgument);
  rest.resume = a.states;
  rest.resume[0].ids[3] = 9999;
  EXPECT_THROW(e.submit(rest), InvalidArgument);
}

// ---- Priority, concurrency, edge cases -------------------------------------------------

// The pool admits one of these requests at a time (a 40-token prompt takes
// 3 of its 5 blocks): A runs, B (priority 0) and C (priority 5) wait; when A
// ends, C goes first, so C streams its tokens while B has produced nothing.
// A's 40 tokens take milliseconds: where A was over before C was queued (a
// busy machine paused this thread), B was rightly admitted alone, so the
// setup is tried again (it was a flaky failure before).
TEST_F(EngineTest, HigherPriorityIsAdmittedFirst) {
  Engine& e = engine({.n_ctx = 128, .kv_blocks = 5});
  Request b = request(prompt_of(40, 2), 2, 40), c = request(prompt_of(40, 3), 3, 40);
  b.stream = c.stream = true;
  c.priority = 5;
  RequestHandle a, hb, hc;
  bool queued_behind_a = false;
  for (int attempt = 0; attempt < 20 && !queued_behind_a; ++attempt) {
    a = e.submit(request(prompt_of(40, 1), 1, 40));
    hb = e.submit(b);
    hc = e.submit(c);
    queued_behind_a = !a.done();
    if (!queued_behind_a) {
      hb.cancel(), hc.cancel();
      e.drain();
    }
  }
  ASSERT_TRUE(queued_behind_a) << "A ended before B and C were queued in every attempt";
  const std::optional<Event> first_c = hc.next();
  ASSERT_TRUE(first_c.has_value());
  EXPECT_EQ(first_c->kind, Event::Kind::Token);
  EXPECT_FALSE(hb.next_for(std::chrono::milliseconds(0)).has_value())
      << "B ran although C has the higher priority";
  EXPECT_EQ(a.wait().status, Response::Status::Ok);
  EXPECT_EQ(hb.wait().status, Response::Status::Ok);
  EXPECT_EQ(hc.wait().status, Response::Status::Ok);
  // Priority never changes an output.
  c.priority = 0;
  c.stream = false;
  EXPECT_TRUE(same_output(hc.wait(), e.run(c)));
}

TEST_F(EngineTest, ManyThreadsSubmitAtOnceAndDrainWaitsForAll) {
  Engine& e = engine({.n_ctx = 128, .kv_blocks = 64, .batch_tokens = 16});
  constexpr int kThreads = 4, kEach = 6;
  std::vector<std::thread> threads;
  std::vector<RequestHandle> handles(kThreads * kEach);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int k = 0; k < kEach; ++k) {
        handles[static_cast<size_t>(t * kEach + k)] =
            e.submit(request(prompt_of(5 + k, t), static_cast<uint64_t>(t * 100 + k), 12));
      }
    });
  }
  for (std::thread& th : threads) th.join();
  e.drain();
  const EngineStats s = e.stats();
  EXPECT_EQ(s.requests_submitted, kThreads * kEach);
  EXPECT_EQ(s.requests_finished, kThreads * kEach) << "drain() returned before the end";
  for (RequestHandle& h : handles) EXPECT_TRUE(h.done());
}

TEST_F(EngineTest, NothingToGenerateStillEndsEverySampleWithAFinishEvent) {
  Engine& e = engine();
  Request r = request(prompt_of(6, 0), 1, 0);
  r.n = 3;
  r.stream = true;
  RequestHandle h = e.submit(r);
  int finishes = 0, tokens = 0;
  while (std::optional<Event> ev = h.next()) {
    finishes += ev->kind == Event::Kind::Finish ? 1 : 0;
    tokens += ev->kind == Event::Kind::Token ? 1 : 0;
  }
  EXPECT_EQ(finishes, 3);
  EXPECT_EQ(tokens, 0);
  for (const SampleResult& sr : h.wait().samples) EXPECT_EQ(sr.finish, FinishReason::Length);
  RequestHandle empty;
  EXPECT_TRUE(empty.done());
  EXPECT_THROW(empty.wait(), std::logic_error);
}

// Resumed requests recompute their ids; preempted in a crowd they do it
// again, and still continue exactly.
TEST_F(EngineTest, ResumedRequestsPreemptedInACrowdContinueExactly) {
  Engine& big = engine({.n_ctx = 128, .kv_blocks = 64});
  std::vector<Request> fulls, rests;
  std::vector<Response> want_full, firsts;
  for (int k = 0; k < 6; ++k) {
    Request r = request(prompt_of(12 + k, k), 50 + static_cast<uint64_t>(k), 40);
    r.n = 1 + k % 3;
    want_full.push_back(big.run(r));
    Request first = r;
    first.max_tokens = 15;
    firsts.push_back(big.run(first));
    Request rest = r;
    rest.prompt_ids = firsts.back().prompt_ids;
    rest.max_tokens = 25;
    rest.resume = firsts.back().states;
    rests.push_back(rest);
  }
  Engine& small = engine({.n_ctx = 128, .kv_blocks = 12, .batch_tokens = 8});
  std::vector<RequestHandle> handles;
  for (const Request& r : rests) handles.push_back(small.submit(r));
  for (size_t k = 0; k < rests.size(); ++k) {
    const Response& got = handles[k].wait();
    ASSERT_EQ(got.status, Response::Status::Ok) << got.error;
    for (size_t i = 0; i < got.samples.size(); ++i) {
      std::vector<TokenId> ids = firsts[k].samples[i].ids;
      ids.insert(ids.end(), got.samples[i].ids.begin(), got.samples[i].ids.end());
      EXPECT_EQ(ids, want_full[k].samples[i].ids) << "request " << k << " sample " << i;
    }
  }
  small.drain();
  EXPECT_GT(small.stats().preemptions, 0) << "the test no longer preempts; shrink the pool";
}

}  // namespace
}  // namespace encore
