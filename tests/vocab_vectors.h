// Readers for llama.cpp's tokenizer test vectors (../shared/testdata/vocab,
// format in its README.md), shared by the tokenizer data tests.
#pragma once

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "encore/tokenizer.h"

namespace encore {

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The .inp format: every string is followed by "\n__ggml_vocab_test__\n".
inline std::vector<std::string> read_inputs(const std::string& path) {
  const std::string all = slurp(path);
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t hit; (hit = all.find(sep, pos)) != std::string::npos; pos = hit + sep.size()) {
    out.push_back(all.substr(pos, hit - pos));
  }
  return out;
}

// The .out format: one line of " id id ..." per input.
inline std::vector<std::vector<TokenId>> read_outputs(const std::string& path) {
  std::istringstream in(slurp(path));
  std::vector<std::vector<TokenId>> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    std::vector<TokenId> ids;
    for (TokenId id; ls >> id;) ids.push_back(id);
    out.push_back(std::move(ids));
  }
  return out;
}

// `s` with newlines and control bytes escaped, for failure messages; cut
// after `max` bytes (0: never).
inline std::string escaped(std::string_view s, size_t max = 0) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u == '\n') {
      out += "\\n";
    } else if (u < 0x20 || u == 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return max > 0 && out.size() > max ? out.substr(0, max) + "..." : out;
}

}  // namespace encore
