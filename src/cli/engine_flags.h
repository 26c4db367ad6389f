// The flags of every command that opens an engine (`run`, `batch`, `chat`,
// `bench`, `serve`), defined once: the numeric ones from the settings table
// (settings.h: names, help, ranges, defaults and which commands have them),
// the others here, and one translation into EngineOptions.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "encore/audit.h"
#include "encore/engine.h"
#include "encore/settings.h"

namespace encore::cli {

struct EngineFlags {
  int threads = settings::kThreads.int_default();
  int32_t ctx_size = settings::kCtxSize.int_default();
  double kv_mem_mib = settings::kKvMem.def;
  std::string kv_type = "f16";
  int32_t batch_tokens = settings::kBatchTokens.int_default();
  std::string isa;
  bool mmap = false;
  bool prefix_cache = true;
  std::string state_dir;
  std::string redis;
  double state_ttl_s = settings::kStateTtl.def;
  double state_max_mib = settings::kStateMaxMib.def;
  double tenant_state_mib = settings::kTenantStateMib.def;
  bool async_session_writes = settings::kAsyncSessionWrites.def != 0;
  std::string derive_seed;         // --derive-seed FILE: the secret's file
  std::string chat_template_file;  // --chat-template-file FILE: a Jinja template
  std::string template_now;        // --template-now TIME: strftime_now's clock
};

// Which groups of the flags outside the table a command has; the table's
// flags are those whose fronts include `front` (-t, --kv-mem, -c, -b,
// --state-ttl, --state-max-mib, --tenant-state-mib).
enum EngineFlagGroups : unsigned {
  kComputeFlags = 1,  // --isa --kv-type --mmap/--no-mmap
  kPrefixFlag = 8,    // --prefix-cache/--no-prefix-cache
  kStateFlags = 16,   // --state-dir --redis
  kSeedFlag = 32,     // --derive-seed
  kChatFlags = 64,    // --chat-template-file --template-now
};
void add_engine_flags(CLI::App* sub, EngineFlags& f, unsigned groups, settings::Front front);

// The options for `model`. with_session: a session needs a state tier, so
// without --state-dir or --redis the usual directory is used.
EngineOptions engine_options(const std::string& model, const EngineFlags& f, bool with_session);

// --chat-template NAME and --chat-template-file FILE exclude each other (a
// named family would leave the file unused). Call after both are added.
void exclude_template_flags(CLI::App* sub);

// A UTC time as --now / --template-now take it: "2024-07-26T08:30:00Z",
// "2024-07-26T08:30:00", "2024-07-26" or seconds since 1970. Throws
// InvalidArgument naming `flag`.
int64_t parse_utc_time(const std::string& s, std::string_view flag);

// The text of a --chat-template-file (at most kMaxChatTemplateFileBytes,
// checked while reading). Throws InvalidArgument naming `flag`.
std::string read_chat_template_file(const std::string& path, std::string_view flag);

// The largest chat template file read (real ones are under 20 KB).
inline constexpr uint64_t kMaxChatTemplateFileBytes = 1 << 20;

// --audit-log FILE and its options (`encore serve`, `encore batch`).
struct AuditFlags {
  std::string path;
  std::string fsync = "interval";
  int32_t max_mib = settings::kAuditMaxMib.int_default();
  bool redact = false;
};
void add_audit_flags(CLI::App* sub, AuditFlags& f, settings::Front front);
audit::AuditOptions audit_options(const AuditFlags& f);

}  // namespace encore::cli
