#include "audit/line.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "encore/error.h"
#include "util/json_read.h"

namespace encore::audit {
namespace {

constexpr std::string_view kHashKey = ",\"hash\":\"";
constexpr size_t kHexDigits = 64;
// ,"hash":" + 64 hex digits + "}
constexpr size_t kSuffixBytes = kHashKey.size() + kHexDigits + 2;

bool is_hex(std::string_view s) {
  for (const char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch());
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  return fmt::format("{:%Y-%m-%dT%H:%M:%S}.{:03d}Z", fmt::gmtime(secs), ms.count() % 1000);
}

std::string seal(int64_t seq, std::string_view record, const std::string& prev, std::string* hash) {
  // {"seq":N, + the record's members + ,"prev":"P"  then  } for the hash,
  // ,"hash":"H"} for the line.
  std::string text = fmt::format("{{\"seq\":{},", seq);
  text.append(record.substr(1, record.size() - 2));
  text += fmt::format(",\"prev\":\"{}\"", prev);
  *hash = sha256_hex(text + "}");
  text += kHashKey;
  text += *hash;
  text += "\"}\n";
  return text;
}

std::optional<ParsedLine> parse_line(std::string_view text, std::string* why) {
  if (text.size() < kSuffixBytes + 2 ||
      text.substr(text.size() - kSuffixBytes, kHashKey.size()) != kHashKey) {
    *why = "it does not end with its hash";
    return std::nullopt;
  }
  const std::string_view hex = text.substr(text.size() - kHexDigits - 2, kHexDigits);
  if (!is_hex(hex) || text.substr(text.size() - 2) != "\"}") {
    *why = "it does not end with its hash";
    return std::nullopt;
  }
  std::string body(text.substr(0, text.size() - kSuffixBytes));
  body += "}";
  if (sha256_hex(body) != hex) {
    *why = "it does not match its hash (its content was changed)";
    return std::nullopt;
  }
  ParsedLine p;
  if (!util::json_depth_within(text, kMaxJsonDepth)) {
    *why = fmt::format("it nests deeper than {} levels", kMaxJsonDepth);
    return std::nullopt;
  }
  try {
    p.json = Json::parse(text);
  } catch (const nlohmann::json::exception&) {
    *why = "it is not valid JSON";
    return std::nullopt;
  }
  const Json& j = p.json;
  if (!j.is_object() || !j.contains("seq") || !j["seq"].is_number_unsigned() ||
      !j.contains("type") || !j["type"].is_string() || !j.contains("prev") ||
      !j["prev"].is_string() || j["prev"].get<std::string>().size() != kHexDigits) {
    *why = "it lacks seq, type or prev";
    return std::nullopt;
  }
  const uint64_t seq = j["seq"].get<uint64_t>();
  if (seq < 1 || seq > (uint64_t{1} << 62)) {
    *why = "its seq is out of range";
    return std::nullopt;
  }
  p.seq = static_cast<int64_t>(seq);
  p.type = j["type"].get<std::string>();
  p.prev = j["prev"].get<std::string>();
  p.hash = std::string(hex);
  return p;
}

LineReader::LineReader(const std::string& path)
    : in_(path, std::ios::binary), lines_(in_, kMaxLineBytes) {
  if (!in_) throw InvalidArgument(fmt::format("{}: cannot open the file", path));
}

}  // namespace encore::audit
