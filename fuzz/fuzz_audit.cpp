// libFuzzer target for the audit log reader (src/audit): `encore audit
// verify` and `encore replay` read files from outside. The first byte picks
// the mode: raw (the input is the file) or sealed (each input line that is
// a JSON object is sealed into a valid chain first, so the fuzzer reaches
// the request-line parser behind the hash check). verify() must return a
// report, and every verified request line must parse or throw
// encore::InvalidArgument; anything else (crash, sanitizer report, another
// exception, hang) is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "audit/item.h"
#include "audit/line.h"
#include "encore/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool sealed = data[0] & 1;
  const std::string input(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::string file = input;
  if (sealed) {
    file.clear();
    std::istringstream in(input);
    std::string line, prev = encore::audit::kGenesis;
    int64_t seq = 0;
    while (std::getline(in, line)) {
      const auto j = nlohmann::ordered_json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.is_object() || j.empty()) continue;
      std::string hash;
      file += encore::audit::seal(++seq, j.dump(), prev, &hash);
      prev = hash;
    }
  }
  const std::string path = "/tmp/encore-fuzz-audit-" + std::to_string(getpid()) + ".log";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << file;
  try {
    encore::audit::verify({path}, [](const encore::audit::Line& l) {
      if (!l.json.contains("type") || l.json["type"] != "request") return;
      try {
        encore::audit::parse_request_line(l);
      } catch (const encore::InvalidArgument&) {
      }
    });
  } catch (const encore::InvalidArgument&) {
  }
  std::remove(path.c_str());
  return 0;
}
