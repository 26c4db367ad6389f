// The audit log end to end (issue 27), through the real binaries: mixed
// requests through `encore serve --audit-log --shadow-rate 1` replay
// `identical` with `encore replay`; damage to the log is named by `encore
// audit verify` and `encore replay`; an output changed in the log (the
// chain rebuilt around it) is reported `differs`; another model skips every
// request; a redacted `encore batch` log replays with --inputs; a server
// killed with SIGKILL leaves at most a torn last line.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "audit/line.h"
#include "serve_fixture.h"

namespace encore::test {
namespace {

using Json = nlohmann::ordered_json;

const std::string kModel = ENCORE_SHARED_DIR "/models/stories260K.gguf";

// The replay's per-request results (--json) and its summary.
struct Replayed {
  int exit_code = -1;
  std::vector<Json> results;
  Json summary;
  std::string err;
};

Replayed replay(const Args& args) {
  const CliResult r = run_encore(Args{"replay", "--json", "-t", "2"} + args);
  Replayed out;
  out.exit_code = r.exit_code;
  out.err = r.err;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    const Json j = Json::parse(line, nullptr, false);
    if (j.is_discarded()) continue;
    if (j.contains("summary")) {
      out.summary = j["summary"];
    } else {
      out.results.push_back(j);
    }
  }
  return out;
}

std::string metric(ServeProcess& s, const std::string& name) {
  httplib::Client c = s.client();
  auto r = c.Get("/metrics");
  if (!r) return "";
  const size_t at = r->body.find("\n" + name + " ");
  if (at == std::string::npos) return "";
  const size_t from = at + name.size() + 2;
  return r->body.substr(from, r->body.find('\n', from) - from);
}

// One log for the suite: ~50 mixed requests of two tenants.
class AuditServe : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::ifstream(kModel)) return;
    dir_ = new TempDir;
    log_ = new std::string(dir_->file("audit.log"));
    std::ofstream(dir_->file("keys")) << "alice-key-1234 alice\nbob-key-123456 bob\n";
    ServeProcess s(kModel,
                   {"--audit-log", *log_, "--state-dir", dir_->file("state"), "--shadow-rate", "1",
                    "--chat-template", "chatml", "--api-keys", dir_->file("keys")});
    ASSERT_TRUE(s.ready()) << s.stderr_text();
    drive(s);
    // Every completed request was checked, none differed.
    for (int i = 0; i < 300 && metric(s, "encore_consistency_pending") != "0"; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    *checks_ = metric(s, "encore_consistency_checks_total");
    *mismatches_ = metric(s, "encore_consistency_mismatches_total{reason=\"output\"}");
    ASSERT_EQ(s.stop(), 0) << s.stderr_text();
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete log_;
  }
  void SetUp() override {
    if (!std::ifstream(kModel)) GTEST_SKIP() << "no " << kModel;
  }

  static httplib::Headers key(int tenant) {
    return {{"Authorization", tenant == 0 ? "Bearer alice-key-1234" : "Bearer bob-key-123456"}};
  }
  static int post(ServeProcess& s, const std::string& path, const Json& body, int tenant) {
    int status = 0;
    post_json(s, path, nlohmann::json::parse(body.dump()), &status, key(tenant));
    return status;
  }

  static void drive(ServeProcess& s) {
    int sent = 0;
    auto ok = [&](const std::string& path, const Json& body, int tenant) {
      ++sent;
      EXPECT_EQ(post(s, path, body, tenant), 200) << body.dump();
    };
    // Three samples that end with EOG (a strong bias on the EOS id) after 11, 11 and 19 tokens.
    ok("/v1/completions",
       {{"prompt", "Once upon a time"},
        {"max_tokens", 60},
        {"n", 3},
        {"seed", 11},
        {"logit_bias", {{"2", 20}}}},
       0);
    // Completions: n > 1, stop strings, logprobs, penalties, bias, given or drawn seeds.
    for (int i = 0; i < 20; ++i) {
      Json b = {{"prompt", "Once upon a time " + std::to_string(i)},
                {"max_tokens", 8 + i % 13},
                {"temperature", 0.2 * (i % 6)},
                {"n", 1 + i % 3}};
      if (i % 2 == 0) b["seed"] = 100 + i;
      if (i % 4 == 1) b["stop"] = Json::array({".", " the"});
      if (i % 5 == 2) b["logprobs"] = 2;
      if (i % 7 == 3) b["presence_penalty"] = 0.5;
      if (i % 9 == 4) b["logit_bias"] = {{"403", -100}};
      ok("/v1/completions", b, i % 2);
    }
    // Chat (chatml), some with n = 2 and top_logprobs.
    for (int i = 0; i < 10; ++i) {
      Json b = {
          {"messages",
           Json::array({{{"role", "system"}, {"content", "Tell a story."}},
                        {{"role", "user"}, {"content", "About a cat " + std::to_string(i)}}})},
          {"max_tokens", 12},
          {"n", 1 + i % 2}};
      if (i % 3 == 0) b["seed"] = 7 * i;
      if (i % 4 == 1) {
        b["logprobs"] = true;
        b["top_logprobs"] = 2;
      }
      ok("/v1/chat/completions", b, i % 2);
    }
    // Three sessions over three turns: a prompt, a continuation, an appended prompt.
    for (int k = 0; k < 3; ++k) {
      const std::string id = "story-" + std::to_string(k);
      ok("/v1/completions",
         {{"prompt", "Lily had a " + std::to_string(k)}, {"max_tokens", 6}, {"session_id", id}},
         k % 2);
      int status = 0;  // the record is written after the answer: retried while 404
      for (int t = 0; t < 100 && status != 200; ++t) {
        ++sent;
        status = post(s, "/v1/completions", {{"session_id", id}, {"max_tokens", 6}}, k % 2);
        if (status == 404) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      EXPECT_EQ(status, 200);
      ok("/v1/completions",
         {{"prompt", " and then"}, {"max_tokens", 6}, {"session_id", id}, {"seed", k}}, k % 2);
    }
    // Streams: four in full, one cancelled after its first chunk.
    for (int i = 0; i < 4; ++i) {
      httplib::Client c = s.client();
      auto r = c.Post(
          "/v1/completions", key(0),
          Json({{"prompt", "The dog"}, {"max_tokens", 10}, {"stream", true}, {"n", 2}}).dump(),
          "application/json");
      ++sent;
      ASSERT_TRUE(r);
      EXPECT_NE(r->body.find("[DONE]"), std::string::npos);
    }
    {
      httplib::Client c = s.client();
      httplib::Request req;
      req.method = "POST";
      req.path = "/v1/completions";
      req.headers = key(1);
      req.body =
          Json(
              {{"prompt", "Far away"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}})
              .dump();
      req.set_header("Content-Type", "application/json");
      int chunks = 0;
      req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
        return ++chunks < 3;  // then the client goes away
      };
      httplib::Response res;
      httplib::Error err = httplib::Error::Success;
      c.send(req, res, err);
      ++sent;
    }
    // Bad requests: a field of the wrong type, an unknown session.
    EXPECT_EQ(post(s, "/v1/completions", {{"prompt", "x"}, {"max_tokens", "many"}}, 0), 400);
    EXPECT_EQ(post(s, "/v1/completions", {{"session_id", "nobody"}}, 1), 404);
    sent += 2;
    while (sent < 50) ok("/v1/completions", {{"prompt", "Tom"}, {"max_tokens", 5}}, sent % 2);
  }

  static TempDir* dir_;
  static std::string* log_;
  static std::string* checks_;
  static std::string* mismatches_;
};
TempDir* AuditServe::dir_ = nullptr;
std::string* AuditServe::log_ = nullptr;
std::string* AuditServe::checks_ = new std::string;
std::string* AuditServe::mismatches_ = new std::string;

// What each request line's replay must say: completed and cancelled-with-
// tokens lines are identical; refused ones are skipped.
std::map<std::string, std::string> expected_verdicts(const std::string& log) {
  std::map<std::string, std::string> want;
  for (const std::string& l : read_lines(log)) {
    const Json j = Json::parse(l);
    if (j["type"] != "request") continue;
    if (j["status"] == "rejected") {
      want[j["id"]] = "skipped";
      continue;
    }
    int64_t tokens = 0;
    for (const Json& c : j["choices"]) tokens += c["tokens"].get<int64_t>();
    want[j["id"]] = j["status"] == "completed" || tokens > 0 ? "identical" : "skipped";
  }
  return want;
}

TEST_F(AuditServe, EveryFinishedRequestReplaysIdentical) {
  const std::map<std::string, std::string> want = expected_verdicts(*log_);
  ASSERT_GE(want.size(), 50u);
  int statuses[3] = {0, 0, 0};  // completed, cancelled, rejected
  for (const std::string& l : read_lines(*log_)) {
    const Json j = Json::parse(l);
    if (j["type"] != "request") continue;
    statuses[0] += j["status"] == "completed";
    statuses[1] += j["status"] == "cancelled";
    statuses[2] += j["status"] == "rejected";
  }
  EXPECT_GE(statuses[0], 45);
  EXPECT_EQ(statuses[1], 1) << "the stream cut short is logged as cancelled";
  EXPECT_GE(statuses[2], 2);

  const Replayed r = replay({*log_, "-m", kModel});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(r.results.size(), want.size()) << r.err;
  for (const Json& x : r.results) {
    EXPECT_EQ(x["verdict"], want.at(x["id"])) << x.dump();
  }
  EXPECT_EQ(r.summary["differs"], 0);
  EXPECT_EQ(r.summary["chain_ok"], true);

  // The live checks ran on every completed request, and none differed.
  EXPECT_EQ(*checks_, std::to_string(statuses[0]));
  EXPECT_EQ(*mismatches_, "0");
  int check_lines = 0;
  for (const std::string& l : read_lines(*log_)) {
    const Json j = Json::parse(l);
    if (j["type"] != "check") continue;
    ++check_lines;
    EXPECT_EQ(j["result"], "identical") << l;
  }
  EXPECT_EQ(check_lines, statuses[0]);
}

// The chain rebuilt around a changed output id: the chain holds, and the
// replay finds the token that differs.
// The log with the first request line that `edit` changes (returning its
// id, "" to pass), its chain rebuilt around it: a valid log saying
// something else. The edited line's id is set in *changed.
std::vector<std::string> rewritten(const std::string& log, const std::function<bool(Json&)>& edit,
                                   std::string* changed) {
  std::vector<std::string> lines = read_lines(log);
  std::string prev = audit::kGenesis;
  for (std::string& line : lines) {
    Json j = Json::parse(line);
    if (changed->empty() && j["type"] == "request" && edit(j)) *changed = j["id"];
    const int64_t seq = j["seq"];
    j.erase("seq");
    j.erase("prev");
    j.erase("hash");
    std::string hash;
    line = audit::seal(seq, j.dump(), prev, &hash);
    line.pop_back();
    prev = hash;
  }
  return lines;
}

// The chain rebuilt around a changed output id: the chain holds, and the
// replay finds the token that differs.
TEST_F(AuditServe, AChangedOutputIsReportedAtItsToken) {
  std::string changed;
  const std::vector<std::string> lines = rewritten(
      *log_,
      [](Json& j) {
        if (j["status"] != "completed" || j["choices"][0]["ids"].size() <= 3) return false;
        Json& ids = j["choices"][0]["ids"];
        ids[2] = ids[2].get<int>() == 300 ? 301 : 300;
        return true;
      },
      &changed);
  ASSERT_FALSE(changed.empty());
  TempDir d;
  write_lines(d.file("x.log"), lines);
  EXPECT_EQ(run_encore({"audit", "verify", d.file("x.log")}).exit_code, 0);
  const Replayed r = replay({d.file("x.log"), "-m", kModel});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.summary["differs"], 1);
  for (const Json& x : r.results) {
    if (x["id"] != changed) continue;
    EXPECT_EQ(x["verdict"], "differs");
    EXPECT_NE(x["detail"].get<std::string>().find("choice 0, token 2: logged 30"),
              std::string::npos)
        << x.dump();
  }
}

// A request cut short in the engine whose samples had partly ended (EOG
// after 11 tokens; the third cut after 5): the ended ones replay to the
// same end, the cut one as far as logged.
TEST_F(AuditServe, ARequestCutShortReplaysAsFarAsLogged) {
  std::string changed;
  const std::vector<std::string> lines = rewritten(
      *log_,
      [](Json& j) {
        if (j["request"]["generation"]["n"] != 3 || j["request"]["max_tokens"] != 60) {
          return false;
        }
        Json& c = j["choices"];
        EXPECT_EQ(c[0]["finish_reason"], "eog");
        EXPECT_GT(c[2]["tokens"].get<int>(), c[0]["tokens"].get<int>() + 2) << c.dump();
        j["status"] = "cancelled";
        j["engine_status"] = "cancelled";
        Json ids = Json::array();
        for (int k = 0; k < 5; ++k) ids.push_back(c[2]["ids"][k]);
        c[2]["ids"] = ids;
        c[2]["tokens"] = 5;
        c[2]["finish_reason"] = nullptr;
        return true;
      },
      &changed);
  ASSERT_FALSE(changed.empty());
  TempDir d;
  write_lines(d.file("x.log"), lines);
  const Replayed r = replay({d.file("x.log"), "-m", kModel, "--from", changed, "--to", changed});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(r.results.size(), 1u);
  EXPECT_EQ(r.results[0]["verdict"], "identical") << r.results[0].dump();
  EXPECT_NE(r.results[0]["detail"].get<std::string>().find("as far as logged"), std::string::npos);
  // An id that is not in the log is an error, not an empty, clean replay.
  const Replayed none = replay({*log_, "-m", kModel, "--from", "cmpl-nobody"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("--from cmpl-nobody"), std::string::npos) << none.err;
}

TEST_F(AuditServe, DamageIsNamedByVerifyAndReplay) {
  const std::vector<std::string> good = read_lines(*log_);
  ASSERT_GT(good.size(), 20u);
  struct Case {
    const char* what;
    std::vector<std::string> lines;
    std::string at;
  };
  std::vector<Case> cases;
  {
    std::vector<std::string> l = good;
    l[9][l[9].size() / 2] ^= 1;  // one byte of line 10
    cases.push_back({"edited", l, ":10:"});
  }
  {
    std::vector<std::string> l = good;
    l.erase(l.begin() + 11);  // line 12
    cases.push_back({"deleted", l, ":12:"});
  }
  {
    std::vector<std::string> l = good;
    std::swap(l[14], l[15]);  // lines 15 and 16
    cases.push_back({"reordered", l, ":15:"});
  }
  for (const Case& c : cases) {
    TempDir d;
    write_lines(d.file("x.log"), c.lines);
    const CliResult v = run_encore({"audit", "verify", d.file("x.log")});
    EXPECT_EQ(v.exit_code, 1) << c.what;
    EXPECT_NE(v.out.find("x.log" + c.at + " " + c.what), std::string::npos) << v.out;
    const Replayed r = replay({d.file("x.log"), "-m", kModel});
    EXPECT_EQ(r.exit_code, 1) << c.what;
    EXPECT_EQ(r.summary["chain_ok"], false);
    EXPECT_NE(r.summary["broken"].get<std::string>().find(c.at + " " + c.what), std::string::npos)
        << r.summary.dump();
    EXPECT_EQ(r.summary["differs"], 0) << "lines before the break still replay identical";
  }
}

// --from/--to select a range of request ids, --tenant one tenant's lines.
TEST_F(AuditServe, RangeAndTenantSelectTheLines) {
  std::vector<std::string> ids, alice;
  for (const std::string& l : read_lines(*log_)) {
    const Json j = Json::parse(l);
    if (j["type"] != "request") continue;
    ids.push_back(j["id"]);
    if (j["tenant"] == "alice") alice.push_back(j["id"]);
  }
  ASSERT_GT(ids.size(), 20u);
  const Replayed range = replay({*log_, "-m", kModel, "--from", ids[5], "--to", ids[9]});
  EXPECT_EQ(range.exit_code, 0) << range.err;
  ASSERT_EQ(range.results.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(range.results[i]["id"], ids[5 + i]);
  const Replayed one = replay({*log_, "-m", kModel, "--tenant", "alice"});
  EXPECT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(one.results.size(), alice.size());
  for (const Json& x : one.results) EXPECT_EQ(x["tenant"], "alice");
}

TEST_F(AuditServe, AnotherModelSkipsEveryRequest) {
  TempDir d;
  ASSERT_EQ(
      run_encore({"synth", "-o", d.file("m.gguf"), "--preset", "tiny", "--type", "F16"}).exit_code,
      0);
  const Replayed r = replay({*log_, "-m", d.file("m.gguf")});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  ASSERT_GE(r.results.size(), 50u);
  for (const Json& x : r.results) {
    EXPECT_EQ(x["verdict"], "skipped");
    const std::string why = x["detail"];
    if (why.rfind("rejected", 0) == 0) continue;
    EXPECT_NE(why.find("model fingerprint differs"), std::string::npos) << why;
  }
}

// `encore batch`: a redacted log holds no prompt or output text and replays
// with the ids of an unredacted one (--inputs); without them it skips.
TEST(AuditBatch, ARedactedLogReplaysWithInputs) {
  if (!std::ifstream(kModel)) GTEST_SKIP() << "no " << kModel;
  TempDir d;
  {
    std::ofstream in(d.file("in.jsonl"));
    for (int i = 0; i < 6; ++i) {
      in << Json({{"custom_id", "r" + std::to_string(i)},
                  {"url", "/v1/completions"},
                  {"body",
                   {{"prompt", "Secret plan number " + std::to_string(i)},
                    {"max_tokens", 8},
                    {"seed", i},
                    {"n", 1 + i % 2}}}})
                .dump()
         << "\n";
    }
  }
  for (const bool redact : {true, false}) {
    Args a = {"batch",
              "-m",
              kModel,
              "-i",
              d.file("in.jsonl"),
              "-o",
              d.file("out.jsonl"),
              "--audit-log",
              d.file(redact ? "r.log" : "u.log")};
    if (redact) a.push_back("--audit-redact");
    ASSERT_EQ(run_encore(a).exit_code, 0);
  }
  const std::string redacted = read_file(d.file("r.log"));
  EXPECT_EQ(redacted.find("Secret plan"), std::string::npos);
  EXPECT_EQ(redacted.find("\"ids\""), std::string::npos);
  EXPECT_NE(read_file(d.file("u.log")).find("Secret plan"), std::string::npos);

  const Replayed bare = replay({d.file("r.log"), "-m", kModel});
  EXPECT_EQ(bare.exit_code, 0) << bare.err;
  ASSERT_EQ(bare.results.size(), 6u);
  for (const Json& x : bare.results) {
    EXPECT_EQ(x["verdict"], "skipped");
    EXPECT_NE(x["detail"].get<std::string>().find("redacted"), std::string::npos);
  }
  const Replayed with = replay({d.file("r.log"), "-m", kModel, "--inputs", d.file("u.log")});
  EXPECT_EQ(with.exit_code, 0) << with.err;
  EXPECT_EQ(with.summary["identical"], 6) << with.summary.dump();
  // Prompts only: the outputs are compared by their hash.
  std::vector<std::string> prompts;
  for (const std::string& l : read_lines(d.file("u.log"))) {
    Json j = Json::parse(l);
    j.erase("choices");
    prompts.push_back(j.dump());
  }
  write_lines(d.file("p.jsonl"), prompts);
  const Replayed by_hash = replay({d.file("r.log"), "-m", kModel, "--inputs", d.file("p.jsonl")});
  EXPECT_EQ(by_hash.exit_code, 0) << by_hash.err;
  EXPECT_EQ(by_hash.summary["identical"], 6) << by_hash.summary.dump();
}

// SIGKILL under load: at most a torn last line; every line before it replays
// identical; the next start recovers the torn line and the chain holds.
TEST(AuditKill, AKilledServerLeavesAtMostATornLine) {
  if (!std::ifstream(kModel)) GTEST_SKIP() << "no " << kModel;
  TempDir d;
  const std::string log = d.file("audit.log");
  {
    ServeProcess s(kModel, {"--audit-log", log, "--audit-fsync", "always"});
    ASSERT_TRUE(s.ready()) << s.stderr_text();
    std::atomic<bool> stop{false};
    std::atomic<int> answered{0};
    std::vector<std::thread> clients;
    for (int t = 0; t < 4; ++t) {
      clients.emplace_back([&, t] {
        for (int i = 0; !stop; ++i) {
          int status = 0;
          post_json(
              s, "/v1/completions",
              {{"prompt", "Once " + std::to_string(t * 1000 + i)}, {"max_tokens", 16}, {"n", 2}},
              &status);
          if (status == 200) ++answered;
        }
      });
    }
    for (int i = 0; i < 200 && answered < 12; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(s.pid(), SIGKILL);
    stop = true;
    for (std::thread& c : clients) c.join();
    s.wait_exit();
    EXPECT_GE(answered.load(), 12);
  }
  const CliResult v = run_encore({"audit", "verify", log});
  EXPECT_EQ(v.exit_code, 0) << v.out;
  const Replayed r = replay({log, "-m", kModel});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.summary["differs"], 0);
  int logged = 0;  // the request lines the kill left whole: every one replays identical
  for (const std::string& l : read_lines(log)) {
    const Json j = Json::parse(l, nullptr, false);
    logged += !j.is_discarded() && j["type"] == "request";
  }
  EXPECT_GE(logged, 1);
  EXPECT_EQ(r.summary["identical"], logged);

  // A torn tail, as a crash mid-write leaves it; the next start recovers it.
  std::string text = read_file(log);
  text.resize(text.size() - 25);
  std::ofstream(log, std::ios::binary | std::ios::trunc) << text;
  EXPECT_NE(run_encore({"audit", "verify", log}).out.find("torn"), std::string::npos);
  {
    ServeProcess s(kModel, {"--audit-log", log});
    ASSERT_TRUE(s.ready()) << s.stderr_text();
    int status = 0;
    post_json(s, "/v1/completions", {{"prompt", "Tom"}, {"max_tokens", 4}}, &status);
    EXPECT_EQ(status, 200);
    EXPECT_EQ(s.stop(), 0);
  }
  const CliResult after = run_encore({"audit", "verify", log});
  EXPECT_EQ(after.exit_code, 0) << after.out;
  EXPECT_NE(after.out.find("recovered"), std::string::npos) << after.out;
  const Replayed again = replay({log, "-m", kModel});
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.summary["differs"], 0);
}

}  // namespace
}  // namespace encore::test
