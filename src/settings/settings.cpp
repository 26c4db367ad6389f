// The checks and texts every front end shares (include/encore/settings.h).
#include "encore/settings.h"

#include <fmt/format.h>

#include <cmath>

#include "encore/error.h"

namespace encore::settings {

namespace {

constexpr const Setting* kAll[] = {
    &kTemperature,
    &kTopK,
    &kTopP,
    &kMinP,
    &kTypicalP,
    &kRepeatPenalty,
    &kRepeatLastN,
    &kPresencePenalty,
    &kFrequencyPenalty,
    &kMaxTokens,
    &kN,
    &kLogprobs,
    &kSeed,
    &kIgnoreEos,
    &kParseSpecial,
    &kNormalizeInput,
    &kThreads,
    &kCtxSize,
    &kBatchTokens,
    &kKvMem,
    &kStateTtl,
    &kStateMaxMib,
    &kTenantStateMib,
    &kPort,
    &kMaxInFlight,
    &kTenantInFlight,
    &kMaxConnections,
    &kMaxConnectionsPerIp,
    &kMaxHeaderBytes,
    &kMaxBodyBytes,
    &kIoThreads,
    &kRequestTimeout,
    &kReadTimeout,
    &kReadDeadline,
    &kIdleTimeout,
    &kShutdownGrace,
    &kShutdownDelay,
    &kAsyncSessionWrites,
    &kAuditMaxMib,
    &kAuditRedact,
    &kShadowRate,
};

std::string fronts_text(unsigned fronts) {
  static constexpr std::pair<Front, const char*> kNames[] = {{kApi, "api"},     {kRun, "run"},
                                                             {kChat, "chat"},   {kBatch, "batch"},
                                                             {kServe, "serve"}, {kBench, "bench"}};
  std::string s;
  for (const auto& [bit, name] : kNames) {
    if (!(fronts & bit)) continue;
    if (!s.empty()) s.append(", ");
    s.append(name);
  }
  return s;
}

constexpr const char* kTypeNames[] = {"number", "integer", "uint64", "boolean"};  // by Type

}  // namespace

std::span<const Setting* const> all() { return kAll; }

bool allowed(const Setting& s, double v) {
  if (s.off != kNoOff && v == static_cast<double>(s.off)) return true;
  if (!std::isfinite(v)) return false;
  if (s.type != Type::Number && v != std::floor(v)) return false;
  const bool low = s.min_open ? !(v > s.min) : !(v >= s.min);
  return !low && v <= s.max;
}

void check(const Setting& s, double v) {
  if (!allowed(s, v)) {
    throw InvalidArgument(std::string(s.name),
                          fmt::format("must be {}, got {}", expected_text(s), value_text(v)));
  }
}

std::string value_text(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e19) {
    return fmt::format("{:.0f}", v);
  }
  return fmt::format("{}", v);
}

std::string range_text(const Setting& s) {
  if (s.type == Type::Bool) return "true or false";
  std::string r = fmt::format("{}{}, {}]", s.min_open ? "(" : "[", value_text(s.min),
                              s.type == Type::Seed ? "18446744073709551615" : value_text(s.max));
  if (s.off != kNoOff) r.append(fmt::format(" or {} ({})", s.off, s.off_means));
  return r;
}

std::string expected_text(const Setting& s) {
  if (s.type == Type::Bool) return range_text(s);
  return fmt::format("{} in {}", s.type == Type::Number ? "a number" : "an integer", range_text(s));
}

std::string_view long_flag(const Setting& s) {
  std::string_view f = s.flags;
  const size_t comma = f.find(',');
  if (comma != std::string_view::npos && f.substr(0, comma).size() == 2) f.remove_prefix(comma + 1);
  return f.substr(0, f.find(','));
}

std::string markdown_table() {
  std::string t =
      "| Setting | CLI flags | Type | Default | Range | Front ends | Help |\n"
      "|---|---|---|---|---|---|---|\n";
  for (const Setting* s : kAll) {
    std::string flags;
    for (size_t pos = 0; pos < s->flags.size();) {
      size_t end = s->flags.find(',', pos);
      if (end == std::string_view::npos) end = s->flags.size();
      if (!flags.empty()) flags.append(", ");
      flags.append("`").append(s->flags.substr(pos, end - pos)).append("`");
      pos = end + 1;
    }
    std::string help(s->help);
    for (size_t i = help.find('|'); i != std::string::npos; i = help.find('|', i + 2)) {
      help.replace(i, 1, "\\|");
    }
    t.append(fmt::format("| `{}` | {} | {} | {} | {} | {} | {} |\n", s->name, flags,
                         kTypeNames[static_cast<int>(s->type)],
                         s->type != Type::Bool ? value_text(s->def)
                         : s->def != 0         ? "true"
                                               : "false",
                         range_text(*s), fronts_text(s->fronts), help));
  }
  return t;
}

}  // namespace encore::settings
