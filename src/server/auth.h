// API keys of `encore serve --api-keys FILE`: one key per line,
//   KEY TENANT [max_in_flight=N] [revoked]
// with '#' comments and blank lines. A key maps to a tenant (which salts
// the prefix cache and session keys) and an optional per-tenant limit.
// The file is read once at start; errors name the line.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>

namespace encore::server {

struct ApiKey {
  std::string tenant;
  int max_in_flight = 0;  // 0: the server's default
  bool revoked = false;
};

using ApiKeys = std::unordered_map<std::string, ApiKey>;

// Throws InvalidArgument naming the file and line.
ApiKeys load_api_keys(const std::string& path);

// The key of an "Authorization: Bearer KEY" header value; nullopt otherwise.
std::optional<std::string> bearer_key(const std::string& header);

}  // namespace encore::server
