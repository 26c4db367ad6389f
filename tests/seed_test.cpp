// Seed hygiene below the server (seed.h, src/engine/seed_reuse.h): the
// derivation's encoding pinned by a value computed with the openssl CLI, the
// secret file's checks and creation, the reuse window's bounds, and the
// engine's side on a synthetic model: where a seed came from, a derived seed
// from a session's merged ids, normalized text appended to a session. The
// same features through the real server: cli_serve_seed_test.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "encore/engine.h"
#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/seed.h"
#include "engine/seed_reuse.h"
#include "engine_test_util.h"
#include "synth_test_util.h"

namespace encore::test {
namespace {

const std::string kSecret = "0123456789abcdef0123456789abcdef";  // 32 bytes

// The encoding is a contract: a derived seed reported last year must be
// derived again from the same secret and input. Computed with the openssl CLI:
//   printf "$MSG" | openssl dgst -sha256 -mac HMAC -macopt key:$KEY
// with KEY 0123456789abcdef0123456789abcdef and MSG, piece by piece (label,
// tenant length, tenant, id count, ids):
//   'encore-seed-v1\0' '\x05\0\0\0\0\0\0\0' 'alice' '\x03\0\0\0\0\0\0\0'
//   '\x01\0\0\0' '\xff\xff\xff\xff' '\x00\x01\0\0'
// f8f4770dfaea2dc0...: its first 8 bytes little-endian, masked to 53 bits.
TEST(EngineSeed, DerivedSeedIsTheDocumentedHmac) {
  const std::vector<TokenId> ids = {1, -1, 256};
  EXPECT_EQ(derive_seed(kSecret, "alice", ids), 3917534385927416u);
}

TEST(EngineSeed, DerivedSeedChangesWithEachInput) {
  const std::vector<TokenId> ids = {1, 2, 3};
  const uint64_t base = derive_seed(kSecret, "alice", ids);
  EXPECT_EQ(derive_seed(kSecret, "alice", ids), base);
  EXPECT_LE(base, kSeedMask);
  EXPECT_NE(derive_seed(kSecret, "bob", ids), base);
  EXPECT_NE(derive_seed(kSecret, "alice", std::vector<TokenId>{1, 2, 4}), base);
  EXPECT_NE(derive_seed(kSecret, "alice", std::vector<TokenId>{1, 2}), base);
  std::string other = kSecret;
  other[0] = 'X';
  EXPECT_NE(derive_seed(other, "alice", ids), base);
  // Length prefixes: the tenant's bytes never run into the ids.
  EXPECT_NE(derive_seed(kSecret, std::string("a\x01\0\0\0", 5), {}),
            derive_seed(kSecret, "a", std::vector<TokenId>{1}));
}

std::string message_of(const std::string& path) {
  try {
    load_seed_secret(path, "--derive-seed");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(EngineSeed, AMissingSecretFileIsCreatedPrivateAndKept) {
  TempDir d;
  const std::string path = d.file("secret");
  const std::string first = load_seed_secret(path, "--derive-seed");
  EXPECT_EQ(first.size(), kMinSeedSecretBytes);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(load_seed_secret(path, "--derive-seed"), first) << "the secret changed on reload";
  EXPECT_NE(load_seed_secret(d.file("another"), "--derive-seed"), first);
  // No temporary file is left beside it.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.path)) files += e.is_regular_file();
  EXPECT_EQ(files, 2);
}

TEST(EngineSeed, UnsafeOrShortSecretsAreRefusedNamingTheOption) {
  TempDir d;
  const std::string path = d.file("secret");
  std::ofstream(path) << kSecret;
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  EXPECT_EQ(message_of(path), "(accepted)");
  for (const mode_t mode : {0644, 0640, 0604, 0620}) {
    ASSERT_EQ(chmod(path.c_str(), mode), 0);
    const std::string m = message_of(path);
    EXPECT_NE(m.find("--derive-seed " + path), std::string::npos) << m;
    EXPECT_NE(m.find("chmod 600"), std::string::npos) << m;
  }
  const std::string short_path = d.file("short");
  std::ofstream(short_path) << kSecret.substr(0, 31);
  ASSERT_EQ(chmod(short_path.c_str(), 0600), 0);
  std::string m = message_of(short_path);
  EXPECT_NE(m.find("--derive-seed " + short_path + ": 31 bytes"), std::string::npos) << m;
  m = message_of(d.path.string());  // a directory
  EXPECT_NE(m.find("--derive-seed"), std::string::npos) << m;
  EXPECT_NE(m.find("not a regular file"), std::string::npos) << m;
  // A symbolic link is not followed: it could point anywhere later.
  ASSERT_EQ(chmod(path.c_str(), 0600), 0);
  ASSERT_EQ(symlink(path.c_str(), d.file("link").c_str()), 0);
  m = message_of(d.file("link"));
  EXPECT_NE(m.find("--derive-seed"), std::string::npos) << m;
  EXPECT_NE(m.find("cannot open"), std::string::npos) << m;
}

TEST(EngineSeed, EngineOptionsRefuseAShortSecret) {
  EngineOptions o;
  o.seed_secret = std::string(kMinSeedSecretBytes - 1, 'x');
  try {
    o.validate();
    ADD_FAILURE() << "accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(e.field(), "seed_secret");
  }
  o.seed_secret = std::string(kMaxSeedSecretBytes + 1, 'x');
  EXPECT_THROW(o.validate(), InvalidArgument);
  o.seed_secret = std::string(kMinSeedSecretBytes, 'x');
  EXPECT_NO_THROW(o.validate());
}

TEST(EngineSeed, ReuseIsAnotherPromptUnderTheSameSeedWithinTheWindow) {
  SeedReuse r;
  EXPECT_FALSE(r.given("alice", 5, 100));
  EXPECT_FALSE(r.given("alice", 5, 100)) << "the same request again is no reuse";
  EXPECT_TRUE(r.given("alice", 5, 200));
  EXPECT_TRUE(r.given("alice", 5, 100));
  EXPECT_FALSE(r.given("bob", 5, 300)) << "another tenant's seed counted";
  EXPECT_FALSE(r.given("alice", 6, 300));
  // Pushed out of the window by kSeedReuseWindow other pairs: forgotten.
  EXPECT_FALSE(r.given("carol", 1000, 1));
  for (uint64_t s = 0; s < kSeedReuseWindow; ++s) r.given("carol", 2000 + s, s);
  EXPECT_FALSE(r.given("carol", 1000, 7)) << "the window was not bounded";
  EXPECT_TRUE(r.given("carol", 2000 + kSeedReuseWindow - 1, 7)) << "the newest pair was dropped";
}

TEST(EngineSeed, ReuseTracksABoundedNumberOfTenants) {
  SeedReuse r;
  r.given("first", 1, 1);
  for (size_t t = 0; t < kSeedReuseTenants; ++t) r.given("t" + std::to_string(t), 1, 1);
  EXPECT_EQ(r.tenants(), kSeedReuseTenants);
  // The least recently seen tenant ("first") was dropped with its window.
  EXPECT_FALSE(r.given("first", 1, 2));
  // A tenant seen again moves to the front and is kept.
  EXPECT_TRUE(r.given("t1", 1, 2));
}

// ---- the engine ---------------------------------------------------------------

class EngineSeedRun : public ::testing::Test {
 protected:
  std::unique_ptr<Engine> open(const std::string& secret) {
    static const auto file = std::make_shared<const gguf::File>(
        gguf::File::from_bytes(synth_bytes("tiny", DType::Q8_0), "tiny.gguf"));
    EngineOptions o;
    o.threads = 2;
    o.n_ctx = 256;
    o.kv_bytes = 8 << 20;
    o.state_dir = tmp_.file("state");
    o.fingerprint_cache_dir = "/nonexistent";
    o.seed_secret = secret;
    return Engine::open(file, o);
  }
  TempDir tmp_;
};

TEST_F(EngineSeedRun, ResponseSaysWhereTheSeedCameFrom) {
  auto e = open(kSecret);
  Request r = request(prompt_of(20, 1), 9, 4);
  r.tenant = "alice";
  Response given = e->run(r);
  EXPECT_EQ(given.seed, 9u);
  EXPECT_EQ(given.seed_source, SeedSource::Given);
  r.seed.reset();
  const Response derived = e->run(r);
  EXPECT_EQ(derived.seed_source, SeedSource::Derived);
  EXPECT_EQ(derived.seed, derive_seed(kSecret, "alice", derived.prompt_ids));
  r.prompt_ids = prompt_of(20, 2);
  r.seed = 9;  // alice's 9 with another prompt
  e->run(r);
  e->drain();
  EngineStats s = e->stats();
  EXPECT_EQ(s.seeds_derived, 1);
  EXPECT_EQ(s.seeds_drawn, 0);
  EXPECT_EQ(s.seeds_reused, 1);
  auto plain = open("");
  r.seed.reset();
  const Response drawn = plain->run(r);
  EXPECT_EQ(drawn.seed_source, SeedSource::Drawn);
  EXPECT_EQ(std::string(seed_source_name(drawn.seed_source)), "drawn");
  plain->drain();
  s = plain->stats();
  EXPECT_EQ(s.seeds_drawn, 1);
  EXPECT_EQ(s.seeds_derived, 0);
}

// A new turn of a session without a seed takes the session's seed + the
// turn's index (issue 28), even with a secret: the conversation counts its
// turns as `encore chat` does. Its first turn was derived like any prompt.
TEST_F(EngineSeedRun, ASessionsNextTurnFollowsTheSessionsSeedEvenWithASecret) {
  auto e = open(kSecret);
  Request turn1 = request(prompt_of(20, 3), 5, 6);
  turn1.seed.reset();
  turn1.session = "conv";
  const Response r1 = e->run(turn1);
  EXPECT_EQ(r1.seed_source, SeedSource::Derived);
  EXPECT_EQ(r1.seed, derive_seed(kSecret, "", r1.prompt_ids));
  const std::vector<TokenId> added = {40, 41, 42};
  Request turn2 = request(added, 0, 4);
  turn2.seed.reset();
  turn2.session = "conv";
  const Response r2 = e->run(turn2);
  ASSERT_TRUE(r2.session_found);
  EXPECT_EQ(r2.seed_source, SeedSource::Session);
  EXPECT_EQ(r2.seed, r1.seed + 1);
  EXPECT_EQ(r2.effective.seed, r2.seed);
  // An explicit seed wins for its turn; the next counts from the session's.
  Request turn3 = request(added, 77, 4);
  turn3.session = "conv";
  EXPECT_EQ(e->run(turn3).seed_source, SeedSource::Given);
  Request turn4 = request(added, 0, 4);
  turn4.seed.reset();
  turn4.session = "conv";
  EXPECT_EQ(e->run(turn4).seed, r1.seed + 3);
  e->drain();
  EXPECT_EQ(e->stats().seeds_session, 2);
}

// Text appended to a session is normalized like any prompt text.
TEST_F(EngineSeedRun, NormalizedTextIsAppendedToASession) {
  auto e = open("");
  const std::string decomposed = "  cafe\xCC\x81 ", composed = "caf\xC3\xA9";
  ASSERT_NE(e->tokenize(decomposed), e->tokenize(composed));
  for (const bool normalize : {true, false}) {
    const std::string session = normalize ? "on" : "off";
    Request turn1 = request(prompt_of(10, 4), 5, 2);
    turn1.session = session;
    e->run(turn1);
    Request turn2;
    turn2.prompt = decomposed;
    turn2.normalize_input = normalize;
    turn2.session = session;
    turn2.max_tokens = 1;
    const Response r2 = e->run(turn2);
    ASSERT_EQ(r2.status, Response::Status::Ok) << r2.error;
    const std::vector<TokenId> tail = e->tokenize(normalize ? composed : decomposed);
    ASSERT_GE(r2.prompt_ids.size(), tail.size());
    EXPECT_TRUE(std::equal(tail.begin(), tail.end(), r2.prompt_ids.end() - tail.size()))
        << "normalize_input " << normalize;
  }
}

}  // namespace
}  // namespace encore::test
