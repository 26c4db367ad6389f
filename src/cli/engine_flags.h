// The flags of every command that opens an engine (`run`, `batch`, `chat`,
// `bench`), defined once: the same names, help, ranges and defaults
// everywhere, and one translation into EngineOptions.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "encore/engine.h"

namespace encore::cli {

struct EngineFlags {
  int threads = 0;
  int32_t ctx_size = 0;
  double kv_mem_mib = 0;
  std::string kv_type = "f16";
  int32_t batch_tokens = 512;
  std::string isa;
  bool mmap = false;
  bool prefix_cache = true;
  std::string state_dir;
  std::string redis;
  double state_ttl_s = 0;
  double state_max_mib = 8192;
  double tenant_state_mib = 0;
};

// Which groups of flags a command has.
enum EngineFlagGroups : unsigned {
  kComputeFlags = 1,  // -t --isa --kv-type --kv-mem --mmap/--no-mmap
  kContextFlag = 2,   // -c
  kBatchFlag = 4,     // -b/--batch-size/--batch-tokens
  kPrefixFlag = 8,    // --prefix-cache/--no-prefix-cache
  kStateFlags = 16,   // --state-dir --redis --state-ttl --state-max-mib
  // --tenant-state-mib (for many tenants: `serve`; a key's state_mib=N
  // overrides it, EngineOptions::tenant_shares)
  kTenantStateFlag = 32,
};
void add_engine_flags(CLI::App* sub, EngineFlags& f, unsigned groups);

// The options for `model`. with_session: a session needs a state tier, so
// without --state-dir or --redis the usual directory is used.
EngineOptions engine_options(const std::string& model, const EngineFlags& f, bool with_session);

// CLI::Range lets NaN through (every comparison with NaN is false).
CLI::Validator finite_range(double lo, double hi);

}  // namespace encore::cli
