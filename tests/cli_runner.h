// Runs the `encore` binary built by this tree and captures its output.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace encore::test {

// Command-line arguments; a + b appends b.
using Args = std::vector<std::string>;
inline Args operator+(Args a, const Args& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The lines of a file, without their "\n".
inline std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path, std::ios::binary);
  std::string l;
  while (std::getline(in, l)) out.push_back(l);
  return out;
}

// Writes `lines`, each followed by "\n", over `path`.
inline void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (const std::string& l : lines) out << l << '\n';
}

// A fresh temporary folder, removed when the object dies.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "encore-test-XXXXXX").string();
    path = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// `cache_home`: $XDG_CACHE_HOME of the run; "" = a private one per call, so
// tests never write to the user's ~/.cache and never depend on what earlier
// runs left there (the fingerprint and panel caches).
inline CliResult run_encore(const std::vector<std::string>& args,
                            const std::string& cache_home = "") {
  TempDir tmp;
  std::string cmd =
      "XDG_CACHE_HOME=" + shell_quote(cache_home.empty() ? tmp.path.string() : cache_home) + " " +
      shell_quote(ENCORE_BINARY);
  for (const std::string& a : args) cmd += " " + shell_quote(a);
  cmd += " </dev/null 2>" + shell_quote(tmp.file("stderr"));
  CliResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = read_file(tmp.file("stderr"));
  return r;
}

}  // namespace encore::test
