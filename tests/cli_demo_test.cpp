// The demo model shipped in the repo (issue 29, "a fresh clone speaks English"):
// models/stories260K.gguf generates English through `encore run`, and
// scripts/run.sh with no model runs it (checked with DRY_RUN=1: no setup, no build).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "shared_data.h"

namespace encore::test {
namespace {

const std::string kSourceDir = ENCORE_SOURCE_DIR;
const std::string kDemoModel = kSourceDir + "/models/stories260K.gguf";

// Runs `cmd` through the shell (stdin empty, stderr dropped): its exit code and stdout lines.
struct CommandResult {
  int exit_code = -1;
  std::vector<std::string> lines;
};

CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen((cmd + " </dev/null 2>/dev/null").c_str(), "r");
  if (p == nullptr) return r;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  size_t start = 0;
  for (size_t nl; (nl = out.find('\n', start)) != std::string::npos; start = nl + 1) {
    r.lines.push_back(out.substr(start, nl - start));
  }
  return r;
}

// scripts/run.sh's `encore run` command line for `env` (VAR=value words) and `args`.
CommandResult run_script_dry(const std::string& env, const std::string& args) {
  return run_command("env -u MODEL DRY_RUN=1 " + env + " bash " +
                     shell_quote(kSourceDir + "/scripts/run.sh") + " " + args);
}

TEST(DemoModel, GreedyStoryIsEnglish) {
  const CliResult r =
      run_encore({"run", "-m", kDemoModel, "-p", "Once upon a time", "-n", "64", "--temp", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  for (char c : r.out) {
    ASSERT_TRUE(c == '\n' || (c >= 0x20 && c < 0x7f))
        << "not printable ASCII: byte " << static_cast<int>(static_cast<unsigned char>(c)) << " in "
        << r.out;
  }
  int common = 0;
  for (const char* w : {" the ", " was ", " a ", " to ", " she ", " and ", " with ", " in "}) {
    common += r.out.find(w) != std::string::npos;
  }
  EXPECT_GE(common, 5) << "few common English words in " << r.out;
  EXPECT_GT(r.out.size(), 150u) << r.out;  // 64 tokens of 512-piece vocab: ~4 bytes each
}

// The shipped copy is the one the data tests check against the reference generations.
TEST(DemoModel, SameBytesAsSharedCopy) {
  ENCORE_SHARED_FILE(shared_model, "models/stories260K.gguf");
  const std::string shipped = read_file(kDemoModel);
  ASSERT_EQ(shipped.size(), 1054336u) << kDemoModel;
  EXPECT_TRUE(shipped == read_file(shared_model)) << kDemoModel << " differs from " << shared_model;
}

TEST(RunScript, DefaultsToDemoModel) {
  const CommandResult r = run_script_dry("", "");
  ASSERT_EQ(r.exit_code, 0);
  const std::vector<std::string> want = {
      "build/bin/encore", "run", "-m", "models/stories260K.gguf", "-p",
      "Once upon a time", "-n",  "128"};
  EXPECT_EQ(r.lines, want);
}

TEST(RunScript, ModelFromEnvironmentOrFlag) {
  CommandResult r = run_script_dry("MODEL=/tmp/x.gguf", "-n 5");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.lines, (std::vector<std::string>{"build/bin/encore", "run", "-m", "/tmp/x.gguf", "-n",
                                               "5", "-p", "Once upon a time"}));
  r = run_script_dry("MODEL=/tmp/x.gguf", "-m /tmp/y.gguf -p Hi");
  ASSERT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.lines,
            (std::vector<std::string>{"build/bin/encore", "run", "-m", "/tmp/y.gguf", "-p", "Hi"}));
  r = run_script_dry("MODEL=synth", "");
  ASSERT_EQ(r.exit_code, 0);
  ASSERT_GE(r.lines.size(), 4u);
  EXPECT_EQ(r.lines[3], "build/synth-tiny-q8_0.gguf");
}

}  // namespace
}  // namespace encore::test
