// API keys of `encore serve --api-keys FILE`: one key per line,
//   KEY TENANT [max_in_flight=N] [state_mib=N] [revoked]
// with '#' comments and blank lines. A key maps to a tenant (which salts
// the prefix cache and session keys), an optional per-tenant limit on
// requests in flight and an optional share of the state tiers in MiB (the
// tenant's sessions and KV snapshots stay within it: EngineOptions::
// tenant_shares). A share belongs to the tenant: keys of one tenant may
// repeat it but not disagree on it. The file is read once at start; errors
// name the line.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>

namespace encore::server {

struct ApiKey {
  std::string tenant;
  int max_in_flight = 0;     // 0: the server's default
  uint64_t state_bytes = 0;  // state_mib=N, in bytes; 0: no share of its own (the default)
  bool revoked = false;
};

using ApiKeys = std::unordered_map<std::string, ApiKey>;

// Throws InvalidArgument naming the file and line.
ApiKeys load_api_keys(const std::string& path);

// The tenants' state shares the keys give (tenant -> bytes; tenants without
// one are left out), for EngineOptions::tenant_shares.bytes.
std::map<std::string, uint64_t> tenant_state_bytes(const ApiKeys& keys);

// The key of an "Authorization: Bearer KEY" header value; nullopt otherwise.
std::optional<std::string> bearer_key(const std::string& header);

}  // namespace encore::server
