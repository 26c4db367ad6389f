// A "request" line of the audit log read back for a replay (and the fuzz
// target): untrusted, every field checked. Internal to src/audit.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "encore/audit.h"

namespace encore::audit {

struct LoggedChoice {
  std::optional<std::vector<TokenId>> ids;  // absent in a redacted log
  std::string ids_hash;                     // a redacted log's SHA-256 of the ids
  std::string output_hash;
  std::optional<std::string> finish;  // null: cut short before it ended
  int64_t tokens = 0;
};

// A request line, read back (untrusted: every field checked).
struct Item {
  int64_t seq = 0;
  std::string where;  // FILE:LINE
  std::string id, tenant, status, error;
  std::string model_fp, engine_version, build_id, kv_type;
  int32_t n_ctx = 0;
  bool ran = false;        // the line has a request (not rejected)
  bool engine_ok = false;  // the engine completed it (whatever the client saw)
  Request req;             // prompt_ids (empty when redacted), seed, generation, max_tokens
  std::string prompt_hash;
  std::string session;
  std::optional<std::string> state_hash;   // a session continued without a prompt
  std::optional<std::string> resume_hash;  // resumed states outside a session
  std::vector<LoggedChoice> choices;
};

// Throws InvalidArgument naming FILE:LINE and the field.
Item parse_request_line(const Line& line);

}  // namespace encore::audit
