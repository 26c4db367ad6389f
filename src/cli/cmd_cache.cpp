// `encore cache ls|show|rm|gc|verify|stats`: the state tiers as files and
// keys. Works on the directory (default $XDG_CACHE_HOME/encore) and, with
// --redis, lists the Redis keys too. Reads no model.
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "encore/error.h"
#include "encore/store.h"
#include "model/panel_file.h"
#include "util/text.h"

namespace encore::cli {
namespace {

struct CacheArgs {
  std::string dir;
  std::string panel_dir;  // ls / gc: the panel cache files' folder
  std::string redis;
  std::string name;       // show / rm: a record name (block/..., session/...) or a prefix
  std::string tenant;     // show / rm: only this tenant's
  bool all = false;       // rm: every record
  double max_mib = 8192;  // gc: the size cap
};

std::string state_dir_of(const CacheArgs& a) {
  const std::string dir = a.dir.empty() ? default_state_dir() : a.dir;
  if (dir.empty()) throw InvalidArgument("no state directory: give --state-dir (or set HOME)");
  return dir;
}

// The panel cache files of --mmap (src/model/panel_file.h): the engine's
// default folder unless --panel-dir names another.
std::string panel_dir_of(const CacheArgs& a) {
  return a.panel_dir.empty() ? default_panel_cache_dir() : a.panel_dir;
}

std::string age(int64_t ms) {
  const int64_t s = ms / 1000;
  if (s < 120) return fmt::format("{}s", s);
  if (s < 7200) return fmt::format("{}m", s / 60);
  if (s < 172800) return fmt::format("{}h", s / 3600);
  return fmt::format("{}d", s / 86400);
}

std::string ttl_left(uint64_t expires_ms, int64_t now_ms) {
  if (expires_ms == 0) return "-";
  const auto left = static_cast<int64_t>(expires_ms) - now_ms;
  return left <= 0 ? "expired" : age(left);
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool selected(const DiskRecord& r, const CacheArgs& a) {
  if (!a.tenant.empty() && r.key.tenant != a.tenant) return false;
  return a.all || a.name.empty() || r.key.name.rfind(a.name, 0) == 0;
}

// The Redis keys rm/ls select: tenant (by its key tag) and name prefix.
std::vector<RedisRecord> redis_selected(const CacheArgs& a) {
  std::vector<RedisRecord> out;
  const std::string tag = ":" + tenant_tag(a.tenant) + ":";
  for (RedisRecord& r : list_redis_records(a.redis)) {
    if (!a.tenant.empty() && r.key.find(tag) == std::string::npos) continue;
    if (!a.all && !a.name.empty() && redis_record_name(r.key).rfind(a.name, 0) != 0) continue;
    out.push_back(std::move(r));
  }
  return out;
}

void ls(const CacheArgs& a, bool verify) {
  const std::string dir = state_dir_of(a);
  const int64_t now = now_ms();
  size_t bad = 0;
  fmt::print("{:<10} {:>9} {:>6} {:>7}  {:<12} {:<16} {}\n", "status", "bytes", "used", "ttl",
             "fingerprint", "tenant", "name");
  for (const DiskRecord& r : list_disk_records(dir, verify)) {
    if (!selected(r, a)) continue;
    bad += r.problem ? 1 : 0;
    fmt::print("{:<10} {:>9} {:>6} {:>7}  {:<12} {:<16} {}{}\n",
               r.problem ? store_miss_name(*r.problem) : "ok", r.file_bytes,
               age(now - r.last_used_ms), ttl_left(r.expires_ms, now),
               r.key.system_fingerprint.substr(0, 12),
               r.key.tenant.empty() ? "(default)" : r.key.tenant.substr(0, 16),
               r.key.name.empty() ? r.path : r.key.name,
               r.problem && verify ? fmt::format("  ({})", r.detail) : "");
  }
  if (!a.redis.empty()) {
    for (const RedisRecord& r : redis_selected(a)) {
      fmt::print("{:<10} {:>9} {:>6} {:>7}  redis {}\n", "redis", r.bytes, "-",
                 r.ttl_ms < 0 ? "-" : age(r.ttl_ms), r.key);
    }
  }
  if (a.tenant.empty() && a.name.empty()) {  // shared by every tenant: not a record
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(panel_dir_of(a), ec)) {
      std::error_code e1;
      if (f.path().extension() != ".panels" || !f.is_regular_file(e1)) continue;
      std::string why;
      const auto h = read_panel_file_header(f.path().string(), &why);
      std::error_code e2;
      fmt::print("{:<10} {:>9} {:>6} {:>7}  {:<12} {:<16} panels of {}\n", h ? "ok" : "damaged",
                 f.file_size(e2), "-", "-", f.path().filename().string().substr(0, 12), "(all)",
                 h ? util::printable(h->origin.model_path) : why);
    }
  }
  if (verify) {
    fmt::print(stderr, "verify: {} record(s) would not load\n", bad);
    if (bad > 0)
      throw InvalidArgument(fmt::format("{} damaged or expired record(s) in {}", bad, dir));
  }
}

void show(const CacheArgs& a) {
  const int64_t now = now_ms();
  size_t shown = 0;
  for (const DiskRecord& r : list_disk_records(state_dir_of(a), /*verify=*/true)) {
    if (!selected(r, a)) continue;
    ++shown;
    fmt::print("{}\n  file {} ({} bytes, payload {} bytes)\n", r.key.name, r.path, r.file_bytes,
               r.payload_bytes);
    fmt::print("  system fingerprint {}\n  tenant '{}'\n", r.key.system_fingerprint, r.key.tenant);
    fmt::print("  created {} ago, used {} ago, expires {}\n",
               age(now - static_cast<int64_t>(r.created_ms)), age(now - r.last_used_ms),
               ttl_left(r.expires_ms, now));
    fmt::print("  status {}{}\n", r.problem ? store_miss_name(*r.problem) : "ok",
               r.problem ? ": " + r.detail : "");
  }
  if (shown == 0) throw InvalidArgument(fmt::format("no record named {}*", a.name));
}

void rm(const CacheArgs& a) {
  if (a.name.empty() && !a.all) throw InvalidArgument("rm: name a record (or a prefix), or --all");
  int64_t n = 0;
  uint64_t bytes = 0;
  for (const DiskRecord& r : list_disk_records(state_dir_of(a), false)) {
    if (!selected(r, a)) continue;
    std::error_code ec;
    if (std::filesystem::remove(r.path, ec)) {
      ++n;
      bytes += r.file_bytes;
    }
  }
  fmt::print("removed {} record(s), {:.1f} MiB\n", n, bytes / 1048576.0);
  if (!a.redis.empty()) {  // else a removed session would come back from Redis
    std::vector<std::string> keys;
    for (const RedisRecord& r : redis_selected(a)) keys.push_back(r.key);
    fmt::print("removed {} Redis key(s)\n", remove_redis_records(a.redis, keys));
  }
}

void gc(const CacheArgs& a) {
  const GcResult g =
      collect_disk_garbage(state_dir_of(a), static_cast<uint64_t>(a.max_mib * 1048576.0),
                           /*verify=*/true);
  fmt::print("removed {} file(s), {:.1f} MiB\n", g.removed, g.bytes_freed / 1048576.0);
  const auto panels = collect_panel_garbage(panel_dir_of(a), /*dry_run=*/false);
  for (const auto& [path, why] : panels) fmt::print("removed {}: {}\n", path, why);
  fmt::print("removed {} panel cache file(s)\n", panels.size());
}

void stats(const CacheArgs& a) {
  struct Sum {
    int64_t records = 0, damaged = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, Sum> by;             // kind per fingerprint
  std::map<std::string, Sum> tenants;        // what counts against each tenant's share
  std::map<std::string, std::string> names;  // Redis tenant tag -> tenant
  for (const DiskRecord& r : list_disk_records(state_dir_of(a), false)) {
    if (!a.tenant.empty() && r.key.tenant != a.tenant) continue;
    const std::string kind = r.key.name.substr(0, r.key.name.find('/'));
    for (Sum* s : {&by[fmt::format("{} {}", r.key.system_fingerprint.substr(0, 12), kind)],
                   &tenants[r.key.tenant]}) {
      ++s->records;
      s->damaged += r.problem ? 1 : 0;
      s->bytes += r.file_bytes;
    }
    names[tenant_tag(r.key.tenant)] = r.key.tenant;
  }
  fmt::print("{:<28} {:>8} {:>8} {:>10}\n", "fingerprint kind", "records", "damaged", "MiB");
  for (const auto& [k, s] : by) {
    fmt::print("{:<28} {:>8} {:>8} {:>10.1f}\n", k, s.records, s.damaged, s.bytes / 1048576.0);
  }
  fmt::print("{:<28} {:>8} {:>8} {:>10}\n", "tenant (all fingerprints)", "records", "damaged",
             "MiB");
  for (const auto& [t, s] : tenants) {
    fmt::print("{:<28} {:>8} {:>8} {:>10.1f}\n", t.empty() ? "(default)" : t.substr(0, 28),
               s.records, s.damaged, s.bytes / 1048576.0);
  }
  if (!a.redis.empty()) {
    const std::vector<RedisRecord> keys = list_redis_records(a.redis);
    int64_t bytes = 0;
    for (const RedisRecord& r : keys) bytes += r.bytes;
    fmt::print("redis {}: {} key(s), {:.1f} MiB\n", a.redis, keys.size(), bytes / 1048576.0);
    if (!a.tenant.empty()) names[tenant_tag(a.tenant)] = a.tenant;
    for (const auto& [tag, used] : redis_tenant_usage(a.redis)) {
      const auto name = names.find(tag);
      if (!a.tenant.empty() && name == names.end()) continue;
      fmt::print("redis tenant {}: {:.1f} MiB\n",
                 name == names.end()    ? "tag " + tag
                 : name->second.empty() ? std::string("(default)")
                                        : name->second,
                 used / 1048576.0);
    }
  }
}

}  // namespace

void add_cache_command(CLI::App& app) {
  auto args = std::make_shared<CacheArgs>();
  CLI::App* cache = app.add_subcommand(
      "cache", "Inspect the saved state (sessions, KV snapshots): ls, show, rm, gc, verify, stats");
  cache->require_subcommand(1);
  auto common = [&](CLI::App* sub, bool with_redis) {
    sub->add_option("--state-dir", args->dir,
                    "The state directory (default $XDG_CACHE_HOME/encore)")
        ->type_name("DIR");
    if (with_redis) {
      sub->add_option("--redis", args->redis, "Redis too: redis://HOST:PORT[/DB]")
          ->type_name("URL");
    }
    sub->add_option("--tenant", args->tenant, "Only this tenant's records");
  };
  auto panel_dir = [&](CLI::App* sub) {
    sub->add_option("--panel-dir", args->panel_dir,
                    "The panel cache files of --mmap (default $XDG_CACHE_HOME/encore/panels)")
        ->type_name("DIR");
  };
  CLI::App* s_ls = cache->add_subcommand("ls", "One line per record: status, size, use, TTL, name");
  common(s_ls, true);
  panel_dir(s_ls);
  s_ls->add_option("name", args->name, "Only names starting with this");
  s_ls->callback([args] { ls(*args, false); });
  CLI::App* s_verify = cache->add_subcommand("verify", "Re-check every record's checksums");
  common(s_verify, false);
  s_verify->callback([args] { ls(*args, true); });
  CLI::App* s_show = cache->add_subcommand("show", "Everything about the records named NAME*");
  common(s_show, false);
  s_show->add_option("name", args->name, "Record name or prefix (session/ID, block/HASH)")
      ->required();
  s_show->callback([args] { show(*args); });
  CLI::App* s_rm = cache->add_subcommand("rm", "Remove the records named NAME* (or --all)");
  common(s_rm, true);
  s_rm->add_option("name", args->name, "Record name or prefix");
  s_rm->add_flag("--all", args->all, "Every record");
  s_rm->callback([args] { rm(*args); });
  CLI::App* s_gc = cache->add_subcommand(
      "gc",
      "Remove expired, damaged and interrupted records, the least used over the cap, and "
      "panel cache files (--mmap) whose model is gone or changed");
  common(s_gc, false);
  panel_dir(s_gc);
  s_gc->add_option("--max-mib", args->max_mib, "Size cap in MiB")->check(CLI::Range(0.0, 1e9));
  s_gc->callback([args] { gc(*args); });
  CLI::App* s_stats = cache->add_subcommand(
      "stats",
      "Records and bytes per fingerprint and kind, and per tenant (what its share counts)");
  common(s_stats, true);
  s_stats->callback([args] { stats(*args); });
}

}  // namespace encore::cli
