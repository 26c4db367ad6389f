#include "server/auth.h"

#include <fmt/format.h>

#include <cctype>
#include <fstream>
#include <sstream>

#include "encore/error.h"

namespace encore::server {
namespace {

bool valid_tenant(const std::string& t) {
  if (t.empty() || t.size() > 128) return false;
  for (char c : t) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

ApiKeys load_api_keys(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(fmt::format("--api-keys {}: cannot open the file", path));
  ApiKeys keys;
  std::unordered_map<std::string, std::pair<uint64_t, int>> shares;  // tenant -> bytes, line
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string key, tenant, extra;
    if (!(words >> key)) continue;
    const auto bad = [&](const std::string& why) {
      return InvalidArgument(
          fmt::format("--api-keys {}: line {}: {} (expected: KEY TENANT "
                      "[max_in_flight=N] [state_mib=N] [revoked])",
                      path, no, why));
    };
    if (key.size() < 8) throw bad("the key is shorter than 8 characters");
    if (!(words >> tenant) || !valid_tenant(tenant)) {
      throw bad("no tenant, or one outside [A-Za-z0-9_.-]{1,128}");
    }
    ApiKey k;
    k.tenant = tenant;
    while (words >> extra) {
      if (extra == "revoked") {
        k.revoked = true;
      } else if (extra.rfind("max_in_flight=", 0) == 0) {
        const std::string n = extra.substr(14);
        if (n.empty() || n.size() > 6 || n.find_first_not_of("0123456789") != std::string::npos ||
            std::stoi(n) < 1) {
          throw bad("max_in_flight must be a number in [1, 999999]");
        }
        k.max_in_flight = std::stoi(n);
      } else if (extra.rfind("state_mib=", 0) == 0) {
        const std::string n = extra.substr(10);
        if (n.empty() || n.size() > 7 || n.find_first_not_of("0123456789") != std::string::npos ||
            std::stoi(n) < 1) {
          throw bad("state_mib must be a number of MiB in [1, 9999999]");
        }
        k.state_bytes = static_cast<uint64_t>(std::stoi(n)) << 20;
        const auto [it, first] = shares.emplace(tenant, std::make_pair(k.state_bytes, no));
        if (!first && it->second.first != k.state_bytes) {
          throw bad(fmt::format("state_mib={} but line {} gives tenant {} state_mib={}", n,
                                it->second.second, tenant, it->second.first >> 20));
        }
      } else {
        throw bad(fmt::format("unknown word '{}'", extra));
      }
    }
    if (!keys.emplace(key, k).second) throw bad("the key appears twice");
  }
  return keys;
}

std::map<std::string, uint64_t> tenant_state_bytes(const ApiKeys& keys) {
  std::map<std::string, uint64_t> out;
  for (const auto& [key, k] : keys) {
    if (k.state_bytes > 0) out[k.tenant] = k.state_bytes;
  }
  return out;
}

std::optional<std::string> bearer_key(const std::string& header) {
  // The scheme is case-insensitive (RFC 9110); one or more spaces follow it.
  if (header.size() < 8) return std::nullopt;
  std::string scheme = header.substr(0, 6);
  for (char& c : scheme) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (scheme != "bearer" || header[6] != ' ') return std::nullopt;
  const size_t start = header.find_first_not_of(' ', 6);
  if (start == std::string::npos) return std::nullopt;
  return header.substr(start);
}

}  // namespace encore::server
