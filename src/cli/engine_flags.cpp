#include "cli/engine_flags.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

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
    sub->add_option(
        "--isa", f.isa,
        "Kernels: scalar, avx2, avxvnni or avx512 (default: ENCORE_ISA, else the best the CPU "
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
  if (groups & kChatFlags) {
    sub->add_option("--chat-template-file", f.chat_template_file,
                    "Render chat messages with this Jinja template instead of the model's "
                    "tokenizer.chat_template (a --chat-template NAME still wins)")
        ->type_name("FILE");
    sub->add_option("--template-now", f.template_now,
                    "strftime_now's clock in chat templates: a UTC time (2024-07-26T08:30:00Z) or "
                    "seconds since 1970 (default: the system clock at each request)")
        ->type_name("TIME");
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

void exclude_template_flags(CLI::App* sub) {
  sub->get_option("--chat-template")->excludes(sub->get_option("--chat-template-file"));
}

int64_t parse_utc_time(const std::string& s, std::string_view flag) {
  const size_t digits_from = !s.empty() && s[0] == '-' ? 1 : 0;
  if (s.size() > digits_from && s.size() < 19 &&
      s.find_first_not_of("0123456789", digits_from) == std::string::npos) {
    try {
      return std::stoll(s);
    } catch (const std::exception&) {
    }
  }
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
  char tail[4] = {0};
  const int n =
      std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%3s", &y, &mo, &d, &h, &mi, &sec, tail);
  const bool ok = (n == 3 && s.size() == 10) || (n == 6 && s.size() == 19) ||
                  (n == 7 && s.size() == 20 && std::string(tail) == "Z");
  using namespace std::chrono;
  const year_month_day ymd{year{y}, month{static_cast<unsigned>(mo)},
                           day{static_cast<unsigned>(d)}};
  if (!ok || !ymd.ok() || h > 23 || mi > 59 || sec > 59) {
    throw InvalidArgument(std::string(flag),
                          fmt::format("'{}' is not a UTC time like 2024-07-26T08:30:00Z, a date "
                                      "like 2024-07-26 or seconds since 1970",
                                      s));
  }
  return duration_cast<seconds>(sys_days(ymd).time_since_epoch()).count() + h * 3600 + mi * 60 +
         sec;
}

std::string read_chat_template_file(const std::string& path, std::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InvalidArgument(std::string(flag), fmt::format("cannot open {}", path));
  }
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxChatTemplateFileBytes) {
      throw InvalidArgument(
          std::string(flag),
          fmt::format("{} is over {} bytes: not a chat template", path, kMaxChatTemplateFileBytes));
    }
  }
  if (text.empty()) throw InvalidArgument(std::string(flag), fmt::format("{} is empty", path));
  return text;
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
  if (!f.chat_template_file.empty()) {
    o.chat_template_text = read_chat_template_file(f.chat_template_file, "--chat-template-file");
    o.chat_template_origin = f.chat_template_file;
  }
  if (!f.template_now.empty()) o.template_now = parse_utc_time(f.template_now, "--template-now");
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
