// One audit line's text: how the writer seals it and how a reader checks
// it (the format is in include/encore/audit.h). Internal to src/audit.
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include "encore/audit.h"
#include "util/line_reader.h"

namespace encore::audit {

// The line (with "\n") for a record already serialized as a JSON object
// (`record`: "{...}", not empty), with its seq and the previous hash; sets
// *hash to the new line's hash.
std::string seal(int64_t seq, std::string_view record, const std::string& prev, std::string* hash);

// Audit records nest 4 levels; a line nesting deeper is not one.
inline constexpr int kMaxJsonDepth = 16;

struct ParsedLine {
  int64_t seq = 0;
  std::string type, prev, hash;
  Json json;
};
// A line's text without its "\n". nullopt, with *why set, when it is not
// valid JSON, lacks seq/type/prev/hash, or does not match its own hash.
std::optional<ParsedLine> parse_line(std::string_view text, std::string* why);

// UTC now with milliseconds: "2026-12-06T17:20:01.123Z".
std::string utc_now();

// Reads a file a line at a time, each at most kMaxLineBytes (a longer one is
// reported, not held).
class LineReader {
 public:
  explicit LineReader(const std::string& path);
  using Got = util::LineReader::Line;
  // False at the end of the file.
  bool next(Got& line) { return lines_.next(line); }

 private:
  std::ifstream in_;
  util::LineReader lines_;
};

}  // namespace encore::audit
