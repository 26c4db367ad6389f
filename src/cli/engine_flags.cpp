#include "cli/engine_flags.h"

#include <fmt/format.h>

#include <cmath>

#include "cli/commands.h"
#include "cli/setting_flags.h"
#include "encore/error.h"
#include "encore/seed.h"
#include "encore/thread_pool.h"

namespace encore::cli {

static_assert(settings::kThreads.max == ThreadPool::kMaxThreads);

void add_engine_flags(CLI::App* sub, EngineFlags& f, unsigned groups, settings::Front front) {
  add_setting_flags(sub, f, front);
  if (groups & kComputeFlags) {
    sub->add_option("--isa", f.isa,
                    "Kernels: scalar, avx2 or avx512 (default: ENCORE_ISA, else the best the CPU "
                    "has); speed only, outputs are identical");
    sub->add_option("--kv-type", f.kv_type,
                    "KV cache element type: f16 (default, like llama.cpp) or f32; part of the "
                    "numerics: outputs are reproducible under either, not across them");
    sub->add_flag("--mmap,!--no-mmap", f.mmap,
                  "Map the weights instead of reading them into memory");
  }
  if (groups & kPrefixFlag) {
    sub->add_flag("--prefix-cache,!--no-prefix-cache", f.prefix_cache,
                  "Share the KV of common prompt prefixes (default: on)");
  }
  if (groups & kSeedFlag) {
    sub->add_option("--derive-seed", f.derive_seed,
                    "A request without a seed gets HMAC-SHA256(secret in FILE, tenant, prompt ids) "
                    "as its seed (reported as always): the same input gives the same output, "
                    "unpredictable without the secret. FILE: mode 0600, at least 32 bytes; created "
                    "with 32 random bytes when missing")
        ->type_name("FILE");
  }
  if (groups & kStateFlags) {
    sub->add_option("--state-dir", f.state_dir,
                    "Keep sessions and KV snapshots in DIR (default with --session: "
                    "$XDG_CACHE_HOME/encore)")
        ->type_name("DIR");
    sub->add_option("--redis", f.redis, "Also keep them in Redis: redis://HOST:PORT[/DB]")
        ->type_name("URL");
  }
}

EngineOptions engine_options(const std::string& model, const EngineFlags& f, bool with_session) {
  EngineOptions o;
  o.model_path = model;
  o.mmap = f.mmap;
  o.threads = f.threads;
  o.n_ctx = f.ctx_size;
  o.kv_type = parse_kv_type(f.kv_type);
  o.kv_bytes = static_cast<uint64_t>(f.kv_mem_mib * 1048576.0);
  o.batch_tokens = f.batch_tokens;
  o.prefix_cache = f.prefix_cache;
  if (!f.isa.empty()) o.isa = parse_isa(f.isa);
  o.state_dir = f.state_dir;
  o.redis_url = f.redis;
  if (with_session && o.state_dir.empty() && o.redis_url.empty()) {
    o.state_dir = default_state_dir();
    if (o.state_dir.empty()) {
      throw InvalidArgument("--session: no state directory (set --state-dir, or HOME)");
    }
  }
  o.state_ttl = std::chrono::milliseconds(static_cast<int64_t>(f.state_ttl_s * 1000.0));
  o.state_max_bytes = static_cast<uint64_t>(f.state_max_mib * 1048576.0);
  o.async_session_writes = f.async_session_writes;
  o.tenant_shares.default_bytes = static_cast<uint64_t>(f.tenant_state_mib * 1048576.0);
  if (!f.derive_seed.empty()) o.seed_secret = load_seed_secret(f.derive_seed, "--derive-seed");
  o.log = [](std::string_view line) { fmt::print(stderr, "{}\n", line); };
  return o;
}

void add_audit_flags(CLI::App* sub, AuditFlags& f, settings::Front front) {
  sub->add_option("--audit-log", f.path,
                  "Append one hash-chained JSON line per finished request to FILE "
                  "(docs/audit.md; `encore audit verify`, `encore replay`)")
      ->type_name("FILE");
  sub->add_option("--audit-fsync", f.fsync,
                  "When audit lines are made durable: always (each batch of lines), interval "
                  "(each second) or never (the OS decides)")
      ->check(CLI::IsMember({"always", "interval", "never"}))
      ->capture_default_str();
  add_setting_flags(sub, f, front);
}

audit::AuditOptions audit_options(const AuditFlags& f) {
  audit::AuditOptions o;
  o.path = f.path;
  o.fsync = audit::fsync_from_name(f.fsync);
  o.max_bytes = static_cast<uint64_t>(f.max_mib) << 20;
  o.redact = f.redact;
  return o;
}

}  // namespace encore::cli
