// Sessions through the real binary, each step a new process: `encore run
// --session` continues a generation exactly after a restart (from the disk,
// from Redis, or recomputed when the state is damaged or flushed), a full
// disk loses nothing that was committed, `encore chat` continues a
// conversation in another process with the same answers, and `encore cache`
// lists, verifies, collects and removes what was saved.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "redis_server.h"
#include "shared_data.h"

namespace encore::test {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

const Args kSampling = {"--temp", "1.0", "--top-k", "0", "--top-p", "1", "--min-p", "0"};

long restored(const std::string& err, const std::string& tier) {
  std::smatch m;
  if (!std::regex_search(err, m, std::regex("(\\d+) " + tier))) return -1;
  return std::stol(m[1]);
}

class CliSession : public ::testing::Test {
 protected:
  void SetUp() override {
    ENCORE_SHARED_FILE(path, "models/stories260K.gguf");
    model_ = path;
  }
  Json run(const Args& args, std::string* err = nullptr) {
    const CliResult r = run_encore(Args{"run", "-m", model_, "--json"} + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    if (err) *err = r.err;
    return r.exit_code == 0 ? Json::parse(r.out) : Json::object();
  }
  Args state() const { return {"--state-dir", dir_.file("state")}; }
  Json ids(const Json& j) const { return j.value("ids", Json::array()); }
  // The session's first 15 tokens, then 25 more in a new process.
  Json continued(const Args& where, const std::string& name, std::string* err = nullptr) {
    const Json a =
        run(Args{"-p", "Once upon a time", "--seed", "7", "-n", "15", "--session", name} +
            kSampling + where);
    const Json b = run(Args{"-n", "25", "--session", name} + where, err);
    Json all = ids(a);
    for (const Json& id : ids(b)) all.push_back(id);
    EXPECT_EQ(b.value("seed", 0), 7) << "the continuation uses the session's seed";
    return all;
  }
  std::string model_;
  TempDir dir_;
};

// Issue 28: a new turn without --seed takes the last turn's seed + 1, so the
// same conversation replays without the client repeating seeds; --seed
// still wins.
TEST_F(CliSession, ANewTurnWithoutASeedFollowsFromTheLastTurn) {
  auto turns = [&](const std::string& name, const std::string& seed, const Args& second = {}) {
    const Json a =
        run(Args{"-p", "Once upon a time", "--seed", seed, "-n", "12", "--session", name} +
            kSampling + state());
    const Json b = run(Args{"-p", " Tom went to the park.", "-n", "12", "--session", name} +
                       second + kSampling + state());
    return std::vector<Json>{a, b};
  };
  const std::vector<Json> one = turns("one", "7"), two = turns("two", "7");
  EXPECT_EQ(one[1].value("seed", 0), 8);
  EXPECT_EQ(ids(two[1]), ids(one[1]));
  EXPECT_EQ(two[1].value("seed", 0), 8);
  const std::vector<Json> other = turns("other", "9"), given = turns("given", "7", {"--seed", "3"});
  EXPECT_EQ(other[1].value("seed", 0), 10);
  EXPECT_NE(ids(other[1]), ids(one[1]));
  EXPECT_EQ(given[1].value("seed", 0), 3);
  EXPECT_NE(ids(given[1]), ids(one[1]));
}

// Replica A saves turn 1 (its directory and Redis), replica B continues the
// session from Redis (turn 2), then A gets turn 3: it must continue from B's
// turn in Redis, not from the older turn 1 in its own directory (issue 28).
TEST_F(CliSession, TheNewestTurnWinsOverAnOlderOneInAFasterTier) {
  RedisServer redis;
  const Args a = {"--state-dir", dir_.file("a"), "--redis", redis.url()};
  const Args b = {"--state-dir", dir_.file("b"), "--redis", redis.url()};
  const std::vector<std::string> prompts = {"Once upon a time", " Tom went to the park.",
                                            " Then the sun came out."};
  auto turn = [&](const std::string& session, size_t i, const Args& where) {
    Args args = {"-p", prompts[i], "-n", "10", "--session", session};
    if (i == 0) args = args + Args{"--seed", "7"};
    return run(args + kSampling + where);
  };
  std::vector<Json> hopped = {turn("s", 0, a), turn("s", 1, b), turn("s", 2, a)};
  std::vector<Json> alone = {turn("t", 0, state()), turn("t", 1, state()), turn("t", 2, state())};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(hopped[i].value("prompt_ids", Json()), alone[i].value("prompt_ids", Json()))
        << "turn " << i + 1;
    EXPECT_EQ(ids(hopped[i]), ids(alone[i])) << "turn " << i + 1;
  }
}

TEST_F(CliSession, ContinuesExactlyInANewProcessFromTheDisk) {
  const Json whole =
      ids(run(Args{"-p", "Once upon a time", "--seed", "7", "-n", "40"} + kSampling));
  const Json other =
      ids(run(Args{"-p", "Once upon a time", "--seed", "8", "-n", "40"} + kSampling));
  ASSERT_NE(whole, other);
  std::string err;
  EXPECT_EQ(continued(state(), "story", &err), whole);
  EXPECT_GT(restored(err, "KV blocks restored \\("), 0) << err;
  EXPECT_NE(err.find("session continued"), std::string::npos) << err;
}

TEST_F(CliSession, DamagedStateIsRecomputedWithTheSameOutput) {
  const Json whole =
      ids(run(Args{"-p", "Once upon a time", "--seed", "7", "-n", "40"} + kSampling));
  run(Args{"-p", "Once upon a time", "--seed", "7", "-n", "15", "--session", "s"} + kSampling +
      state());
  int n = 0;
  for (const auto& f : fs::recursive_directory_iterator(dir_.file("state"))) {
    if (f.path().extension() != ".snap") continue;
    std::string bytes = read_file(f.path().string());
    if (bytes.size() < 200 || bytes.find("session/") != std::string::npos) continue;  // blocks
    bytes[bytes.size() - 5] ^= 1;
    std::ofstream(f.path(), std::ios::binary | std::ios::trunc) << bytes;
    ++n;
  }
  ASSERT_GT(n, 0);
  std::string err;
  const Json b = run(Args{"-n", "25", "--session", "s"} + state(), &err);
  Json all = ids(run(Args{"-p", "Once upon a time", "--seed", "7", "-n", "15"} + kSampling));
  for (const Json& id : ids(b)) all.push_back(id);
  EXPECT_EQ(all, whole);
  EXPECT_NE(err.find("will be recomputed"), std::string::npos) << err;
}

// A write that fails (a file size limit standing in for a full disk) is a
// clear message; the request succeeds and the session saved before stays.
TEST_F(CliSession, AFullDiskLosesNothingCommitted) {
  run(Args{"-p", "Once upon a time", "--seed", "7", "-n", "15", "--session", "s"} + kSampling +
      state());
  // Output through a pipe: the limit applies to files only.
  const std::string cmd = "ulimit -f 1; XDG_CACHE_HOME=" + shell_quote(dir_.file("x")) + " " +
                          shell_quote(ENCORE_BINARY) + " run -m " + shell_quote(model_) +
                          " --json -n 10 --session s --state-dir " +
                          shell_quote(dir_.file("state")) + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("File too large"), std::string::npos) << out;
  // The session still holds what was committed before: the same 10 tokens come again.
  const Json again = run(Args{"-n", "10", "--session", "s"} + state());
  const Json first = run(Args{"-p", "Once upon a time", "--seed", "7", "-n", "25"} + kSampling);
  const Json first_ids = ids(first);
  const Json tail(std::vector<Json>(first_ids.begin() + 15, first_ids.end()));
  EXPECT_EQ(ids(again), tail);
}

TEST_F(CliSession, TwoProcessesShareOneRedisAndAFlushOnlyCostsTime) {
  RedisServer redis;
  const Json whole =
      ids(run(Args{"-p", "Once upon a time", "--seed", "7", "-n", "40"} + kSampling));
  std::string err;
  EXPECT_EQ(continued({"--redis", redis.url()}, "shared", &err), whole);
  EXPECT_GT(restored(err, "redis\\)"), 0) << "nothing restored from Redis: " << err;
  EXPECT_NE(err.find("session continued"), std::string::npos) << err;
  // Flushed between the turns: the session is gone; continuing it says so,
  // and a prompt starts it afresh.
  run(Args{"-p", "Once upon a time", "--seed", "7", "-n", "15", "--session", "f"} + kSampling +
      Args{"--redis", redis.url()});
  redis.cli("FLUSHALL");
  const CliResult gone =
      run_encore(Args{"run", "-m", model_, "-n", "5", "--session", "f", "--redis", redis.url()});
  EXPECT_EQ(gone.exit_code, 1) << gone.err;
  EXPECT_NE(gone.err.find("no saved session 'f'"), std::string::npos) << gone.err;
  run(Args{"-p", "Once", "-n", "5", "--session", "f", "--redis", redis.url()}, &err);
  EXPECT_NE(err.find("session started"), std::string::npos) << err;
}

// `--session X` without a prompt continues X; when X was never saved it is
// an error that says so (exit 1), never a fresh story from BOS alone.
TEST_F(CliSession, ContinuingAMissingSessionFailsClearly) {
  const CliResult r =
      run_encore(Args{"run", "-m", model_, "-n", "5", "--session", "nope"} + state());
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.out, "") << "generated something anyway";
  EXPECT_NE(r.err.find("error: session: no saved session 'nope' for this tenant (expired, "
                       "removed, or never saved); send a prompt to start it (-p / -f)"),
            std::string::npos)
      << r.err;
  // With a prompt it starts; then it continues.
  std::string err;
  run(Args{"-p", "Once upon a time", "-n", "5", "--session", "nope"} + state(), &err);
  EXPECT_NE(err.find("session started"), std::string::npos) << err;
  run(Args{"-n", "5", "--session", "nope"} + state(), &err);
  EXPECT_NE(err.find("session continued"), std::string::npos) << err;
}

TEST_F(CliSession, ChatContinuesInAnotherProcessWithTheSameAnswers) {
  const std::string in2 = dir_.file("two.txt"), in_a = dir_.file("a.txt"),
                    in_b = dir_.file("b.txt");
  std::ofstream(in2) << "Hi there\nTell me about the dog\n/exit\n";
  std::ofstream(in_a) << "Hi there\n";
  std::ofstream(in_b) << "Tell me about the dog\n";
  auto chat = [&](const std::string& input, const Args& extra) {
    const std::string cmd = "XDG_CACHE_HOME=" + shell_quote(dir_.file("x")) + " " +
                            shell_quote(ENCORE_BINARY) + " chat -m " + shell_quote(model_) +
                            " --chat-template chatml -n 12 --temp 1 " +
                            [&] {
                              std::string s;
                              for (const std::string& e : extra) s += shell_quote(e) + " ";
                              return s;
                            }() +
                            "< " + shell_quote(input) + " 2>" + shell_quote(dir_.file("cerr"));
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    EXPECT_EQ(pclose(p), 0) << read_file(dir_.file("cerr"));
    return out;
  };
  const std::string both = chat(in2, {"--seed", "5"});
  const std::string first = chat(in_a, Args{"--seed", "5", "--session", "c"} + state());
  const std::string second =
      chat(in_b, Args{"--seed", "5", "--session", "c"} + state());  // turn 2: seed 6
  EXPECT_EQ(first + second, both) << "a chat continued in a new process answers differently";
  EXPECT_NE(read_file(dir_.file("cerr")).find("continued (2 messages)"), std::string::npos)
      << read_file(dir_.file("cerr"));
  const std::string other = chat(in2, {"--seed", "9"});
  EXPECT_NE(other, both);
  // /save NAME keeps the conversation so far under another name; /reset
  // starts over in this process.
  const std::string cmds = dir_.file("cmds.txt");
  std::ofstream(cmds) << "Hi there\n/save kept\n/reset\nHello\n/exit\n";
  chat(cmds, Args{"--seed", "5"} + state());
  const std::string err = read_file(dir_.file("cerr"));
  EXPECT_NE(err.find("(saved as session kept)"), std::string::npos) << err;
  EXPECT_NE(err.find("(conversation reset)"), std::string::npos) << err;
  // After /reset the second prompt is about as long as the first, not the
  // whole conversation.
  std::smatch m1, m2;
  ASSERT_TRUE(std::regex_search(err, m1, std::regex("turn 1: (\\d+) prompt")));
  ASSERT_TRUE(std::regex_search(err, m2, std::regex("turn 2: (\\d+) prompt")));
  EXPECT_LT(std::stol(m2[1]), std::stol(m1[1]) + 8) << err;
  chat(in_b, Args{"--seed", "5", "--session", "kept"} + state());
  EXPECT_NE(read_file(dir_.file("cerr")).find("continued (2 messages)"), std::string::npos)
      << read_file(dir_.file("cerr"));
  // /save right after /reset has nothing to save (not the discarded talk).
  const std::string reset_save = dir_.file("rs.txt");
  std::ofstream(reset_save) << "Hi there\n/reset\n/save dropped\n/exit\n";
  chat(reset_save, Args{"--seed", "5"} + state());
  EXPECT_NE(read_file(dir_.file("cerr")).find("(nothing to save)"), std::string::npos)
      << read_file(dir_.file("cerr"));
  // A chat session can be continued by `encore run` (its last answer goes on).
  std::string run_err;
  const Json more = run(Args{"-n", "6", "--session", "c"} + state(), &run_err);
  EXPECT_EQ(ids(more).size(), 6u) << run_err;
  EXPECT_NE(run_err.find("session continued"), std::string::npos) << run_err;
}

// --mmap keeps a quantised model's repacked weights in a panel cache file:
// written by the first run, mapped by the next (the same text as reading the
// weights into memory), listed by `cache ls`, and removed by `cache gc` once
// its model has changed, not before.
TEST(CliPanelCache, WrittenThenUsedListedAndCollected) {
  TempDir dir;
  const std::string cache = dir.file("cache"), model = dir.file("m.gguf");
  ASSERT_EQ(run_encore({"synth", "--preset", "tiny", "--type", "Q8_0", "-o", model}).exit_code, 0);
  const Args gen = Args{"run", "-m", model, "-p", "Once", "-n", "12", "--seed", "3"} + kSampling;
  const CliResult in_memory = run_encore(gen, cache);
  ASSERT_EQ(in_memory.exit_code, 0) << in_memory.err;
  EXPECT_NE(in_memory.err.find("(memory)"), std::string::npos) << in_memory.err;
  const CliResult first = run_encore(gen + Args{"--mmap"}, cache);
  EXPECT_NE(first.err.find("(panel cache written)"), std::string::npos) << first.err;
  const CliResult second = run_encore(gen + Args{"--mmap"}, cache);
  EXPECT_NE(second.err.find("(panel cache hit)"), std::string::npos) << second.err;
  EXPECT_EQ(first.out, in_memory.out);
  EXPECT_EQ(second.out, in_memory.out);
  const std::string panels = cache + "/encore/panels";
  auto count = [&] {
    int n = 0;
    for (const auto& f : fs::directory_iterator(panels)) n += f.path().extension() == ".panels";
    return n;
  };
  ASSERT_EQ(count(), 1);
  const Args d = {"--state-dir", cache + "/encore"};
  const CliResult ls = run_encore(Args{"cache", "ls"} + d, cache);
  EXPECT_NE(ls.out.find("panels of " + fs::absolute(model).string()), std::string::npos) << ls.out;
  EXPECT_NE(run_encore(Args{"cache", "gc"} + d, cache).out.find("removed 0 panel cache file(s)"),
            std::string::npos);
  EXPECT_EQ(count(), 1);
  // The model rewritten (another mtime): its panel file is stale.
  fs::last_write_time(model, fs::last_write_time(model) + std::chrono::seconds(5));
  const CliResult gc = run_encore(Args{"cache", "gc"} + d, cache);
  EXPECT_NE(gc.out.find("has changed"), std::string::npos) << gc.out;
  EXPECT_NE(gc.out.find("removed 1 panel cache file(s)"), std::string::npos) << gc.out;
  EXPECT_EQ(count(), 0);
}

TEST_F(CliSession, CacheListsVerifiesCollectsAndRemoves) {
  run(Args{"-p", "Once upon a time", "--seed", "7", "-n", "40", "--session", "s"} + kSampling +
      state());
  const Args d = state();
  CliResult ls = run_encore(Args{"cache", "ls"} + d);
  ASSERT_EQ(ls.exit_code, 0) << ls.err;
  EXPECT_NE(ls.out.find("session/s"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("block/"), std::string::npos) << ls.out;
  EXPECT_EQ(run_encore(Args{"cache", "verify"} + d).exit_code, 0);
  // Damage one block record: verify fails and names it, gc removes it.
  for (const auto& f : fs::recursive_directory_iterator(dir_.file("state"))) {
    if (f.path().extension() != ".snap") continue;
    std::string bytes = read_file(f.path().string());
    if (bytes.find("session/") != std::string::npos) continue;
    bytes[bytes.size() - 1] ^= 1;
    std::ofstream(f.path(), std::ios::binary | std::ios::trunc) << bytes;
    break;
  }
  const CliResult bad = run_encore(Args{"cache", "verify"} + d);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.out.find("corrupt"), std::string::npos) << bad.out;
  EXPECT_NE(run_encore(Args{"cache", "gc"} + d).out.find("removed 1 file"), std::string::npos);
  EXPECT_EQ(run_encore(Args{"cache", "verify"} + d).exit_code, 0);
  const CliResult st = run_encore(Args{"cache", "stats"} + d);
  EXPECT_NE(st.out.find("session"), std::string::npos) << st.out;
  EXPECT_TRUE(std::regex_search(st.out, std::regex("\\(default\\) +[1-9]")))
      << "no per-tenant usage: " << st.out;
  EXPECT_NE(run_encore(Args{"cache", "rm", "--all"} + d).out.find("removed"), std::string::npos);
  EXPECT_EQ(run_encore(Args{"cache", "ls"} + d).out.find("block/"), std::string::npos);
}

// --state-max-mib caps the state directory: sessions written past it make
// the least recently used records go.
TEST_F(CliSession, StateMaxMibCapsTheDirectory) {
  auto dir_bytes = [&] {
    uint64_t total = 0;
    for (const auto& f : fs::recursive_directory_iterator(dir_.file("state"))) {
      if (f.path().extension() == ".snap") total += fs::file_size(f.path());
    }
    return total;
  };
  for (int i = 0; i < 6; ++i) {
    run(Args{"-p", "Once upon a time", "--seed", std::to_string(i), "-n", "400", "--session",
             "s" + std::to_string(i), "--state-max-mib", "1"} +
        kSampling + state());
  }
  EXPECT_LE(dir_bytes(), 1u << 20);
  EXPECT_EQ(
      run_encore(Args{"run", "-m", model_, "-n", "5", "--session", "s0", "--state-max-mib", "0.5"} +
                 state())
          .exit_code,
      105)
      << "a cap under 1 MiB is refused";
}

// With a state directory, --save-state also writes the KV blocks, and
// --resume restores them instead of recomputing: the same continuation.
TEST_F(CliSession, ResumeRestoresTheKvFromTheStateDirectory) {
  const Json whole =
      ids(run(Args{"-p", "Once upon a time", "--seed", "3", "-n", "50"} + kSampling));
  const std::string file = dir_.file("s.json");
  const Json a =
      run(Args{"-p", "Once upon a time", "--seed", "3", "-n", "30", "--save-state", file} +
          kSampling + state());
  std::string err;
  const Json b = run(Args{"--resume", file, "-n", "20"} + state(), &err);
  Json all = ids(a);
  for (const Json& id : ids(b)) all.push_back(id);
  EXPECT_EQ(all, whole);
  EXPECT_GT(restored(err, "KV blocks restored \\("), 0) << err;
  // Without the directory the same continuation is recomputed.
  std::string err2;
  const Json c = run(Args{"--resume", file, "-n", "20"}, &err2);
  EXPECT_EQ(ids(c), ids(b));
  EXPECT_EQ(err2.find("KV blocks restored"), std::string::npos);
}

}  // namespace
}  // namespace encore::test
