// The settings table (include/encore/settings.h) is the one range of every
// setting: this test walks it and, for every setting and every front end
// that exposes it, sends the same bad values — NaN, just below the minimum,
// just above the maximum, the wrong type — and checks each is refused naming
// that setting, while both boundaries are accepted. Front ends: the CLI
// flags of `encore run`, `chat`, `batch`, `serve` and `bench` (the real
// binary, which refuses before it opens a model), the OpenAI request parser,
// Request::validate, Server::create and EngineOptions::validate. It also
// checks that each command has exactly the flags the table says it has, and
// that docs/settings.md holds the table as `encore settings` prints it.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "cli_runner.h"
#include "encore/engine.h"
#include "encore/error.h"
#include "encore/openai.h"
#include "encore/request.h"
#include "encore/server.h"
#include "encore/settings.h"

namespace encore::test {
namespace {

using json = nlohmann::json;
using settings::Setting;
using settings::Type;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
const char* const kNoModel = "/nonexistent/encore-settings-test.gguf";

// A value to try: its CLI text and its JSON.
struct Value {
  std::string text;
  json j;
  double number = 0;  // for the library front ends; NaN for a wrong type
  std::string what;   // for messages
};

// v as the CLI and JSON write it (an integer setting's whole values as JSON integers).
Value number(const Setting& s, double v, const std::string& what) {
  const bool whole = s.type != Type::Number && v == std::floor(v);
  return {fmt::format("{}", v), whole ? json(static_cast<int64_t>(v)) : json(v), v, what};
}

// Values every front end must refuse.
std::vector<Value> bad_values(const Setting& s) {
  std::vector<Value> out;
  out.push_back({"nan", json(kNaN), kNaN, "NaN"});
  out.push_back({"abc", json("abc"), kNaN, "a string"});
  if (s.type == Type::Seed) {
    out.push_back({"-2", json(-2), -2, "below the minimum"});
    out.push_back(
        {"18446744073709551616", json::parse("18446744073709551616"), kNaN, "above the maximum"});
    out.push_back({"1.5", json(1.5), kNaN, "a fraction"});
    return out;
  }
  const bool integer = s.type == Type::Integer;
  const double step_lo = integer ? 1 : std::max(1e-3, std::fabs(s.min) * 1e-3);
  const double step_hi = integer ? 1 : std::max(1e-3, std::fabs(s.max) * 1e-3);
  double below = s.min_open ? s.min : s.min - step_lo;
  if (s.off != settings::kNoOff && below == static_cast<double>(s.off)) below -= 1;
  out.push_back(number(s, below, "below the minimum"));
  out.push_back(number(s, s.max + step_hi, "above the maximum"));
  if (integer) out.push_back(number(s, s.min + 0.5, "a fraction"));
  return out;
}

// Both ends of the range (the low one only when it is included).
std::vector<Value> good_values(const Setting& s) {
  std::vector<Value> out;
  if (s.type == Type::Bool)
    return {{"false", json(false), 0, "false"}, {"true", json(true), 1, "true"}};
  if (s.type == Type::Seed) {
    out.push_back({"0", json(0), 0, "the minimum"});
    out.push_back({"18446744073709551615", json(std::numeric_limits<uint64_t>::max()),
                   18446744073709551615.0, "the maximum"});
    return out;
  }
  if (!s.min_open) out.push_back(number(s, s.min, "the minimum"));
  out.push_back(number(s, s.max, "the maximum"));
  return out;
}

std::string trace(const Setting& s, const Value& v) {
  return fmt::format("{} = {} ({})", s.name, v.text, v.what);
}

// ---- the CLI ----------------------------------------------------------------

struct Command {
  settings::Front front;
  Args args;  // up to the setting's flag
};
const Command kCommands[] = {
    {settings::kRun, {"run", "-m", kNoModel}},
    {settings::kChat, {"chat", "-m", kNoModel}},
    {settings::kBatch, {"batch", "-m", kNoModel, "-i", "/dev/null"}},
    {settings::kServe, {"serve", "-m", kNoModel}},
    {settings::kBench, {"bench", "-m", kNoModel}},
};

Args with_flag(const Command& c, const Setting& s, const std::string& text) {
  Args a = c.args;
  // serve binds its port before it loads the model: any free one, unless
  // the port is what is being tried.
  if (c.front == settings::kServe && s.name != "port") a = a + Args{"--port", "0"};
  a.push_back(std::string(settings::long_flag(s)));
  if (s.type != Type::Bool) a.push_back(text);  // a flag without a value is true
  return a;
}

TEST(Settings, EveryCliFlagRefusesTheSameBadValuesAndTakesItsBoundaries) {
  int checked = 0;
  for (const Setting* s : settings::all()) {
    if (s->flags.empty()) continue;
    const std::string flag(settings::long_flag(*s));
    for (const Command& c : kCommands) {
      if (!(s->fronts & c.front)) continue;
      // A boolean is a flag without a value: nothing to get wrong but its presence.
      for (const Value& v : s->type == Type::Bool ? std::vector<Value>{} : bad_values(*s)) {
        SCOPED_TRACE(c.args[0] + " " + trace(*s, v));
        const CliResult r = run_encore(with_flag(c, *s, v.text));
        EXPECT_NE(r.exit_code, 0);
        EXPECT_NE(r.err.find(flag + ": value " + v.text + " is not"), std::string::npos) << r.err;
        EXPECT_NE(r.err.find(settings::range_text(*s)), std::string::npos) << r.err;
        ++checked;
      }
      for (const Value& v : good_values(*s)) {
        if (s->type == Type::Bool && v.number == 0) continue;
        SCOPED_TRACE(c.args[0] + " " + trace(*s, v));
        const CliResult r = run_encore(with_flag(c, *s, v.text));
        // Accepted: the command ran and stopped at the missing model.
        EXPECT_EQ(r.exit_code, 1) << r.err;
        EXPECT_NE(r.err.find(kNoModel), std::string::npos) << r.err;
        EXPECT_EQ(r.err.find("must be"), std::string::npos) << r.err;
        ++checked;
      }
    }
  }
  std::printf("CLI: %d flag values checked\n", checked);
}

// The option names a command's --help lists.
std::set<std::string> help_flags(const Command& c) {
  const CliResult r = run_encore(Args{c.args[0], "--help"});
  std::set<std::string> names;
  std::istringstream in(r.out);
  std::string line;
  while (std::getline(in, line)) {
    const size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos || line[start] != '-') continue;
    std::string first = line.substr(start, line.find(' ', start) - start);
    std::istringstream names_in(first);
    for (std::string n; std::getline(names_in, n, ',');) names.insert(n);
  }
  return names;
}

TEST(Settings, EachCommandHasExactlyTheFlagsTheTableGivesIt) {
  for (const Command& c : kCommands) {
    const std::set<std::string> listed = help_flags(c);
    ASSERT_TRUE(listed.count("--help")) << c.args[0];
    for (const Setting* s : settings::all()) {
      if (s->flags.empty()) continue;
      const bool exposed = (s->fronts & c.front) != 0;
      const bool present = listed.count(std::string(settings::long_flag(*s))) > 0;
      EXPECT_EQ(present, exposed) << c.args[0] << " " << settings::long_flag(*s);
    }
  }
}

// ---- the OpenAI request parser ------------------------------------------------

TEST(Settings, TheOpenAiParserRefusesTheSameBadValuesAndTakesItsBoundaries) {
  int checked = 0;
  for (const Setting* s : settings::all()) {
    if (!(s->fronts & settings::kApi)) continue;
    for (const Value& v : bad_values(*s)) {
      SCOPED_TRACE(trace(*s, v));
      try {
        api::parse_request(json{{std::string(s->name), v.j}}, api::Endpoint::Completions);
        ADD_FAILURE() << "accepted";
      } catch (const api::RequestError& e) {
        EXPECT_EQ(e.field(), s->name) << e.what();
        EXPECT_NE(std::string(e.what()).find(settings::range_text(*s)), std::string::npos)
            << e.what();
      }
      ++checked;
    }
    for (const Value& v : good_values(*s)) {
      SCOPED_TRACE(trace(*s, v));
      const Request r =
          api::parse_request(json{{std::string(s->name), v.j}}, api::Endpoint::Completions);
      visit_settings(r, [&](const Setting& t, const auto& member) {
        if (&t != s) return;
        if constexpr (std::is_arithmetic_v<std::remove_cvref_t<decltype(member)>>) {
          EXPECT_EQ(member, static_cast<std::remove_cvref_t<decltype(member)>>(v.number));
        } else {
          EXPECT_EQ(member, v.j.get<uint64_t>());
        }
      });
      ++checked;
    }
  }
  std::printf("API: %d values checked\n", checked);
}

// ---- the library: Request::validate, Server::create, EngineOptions -----------

// Sets an arithmetic member or a duration (in seconds) to v; false when the
// member cannot hold v at all (NaN in an integer: the type refuses it).
template <class T>
bool assign(T& member, double v) {
  if constexpr (std::is_floating_point_v<T>) {
    member = static_cast<T>(v);
    return true;
  } else if constexpr (std::is_integral_v<T>) {
    if (!std::isfinite(v) || v != std::floor(v) || v < double(std::numeric_limits<T>::min()) ||
        v > double(std::numeric_limits<T>::max())) {
      return false;
    }
    member = static_cast<T>(v);
    return true;
  } else if constexpr (requires { typename T::rep; }) {  // a duration
    if (!std::isfinite(v) || v < 0) return false;
    member = std::chrono::duration_cast<T>(std::chrono::duration<double>(v));
    return std::chrono::duration<double>(member).count() == v;
  } else {
    return false;  // the seed: every uint64 is one
  }
}

template <class Object, class Check>
int walk_library(const char* front, Check check_one) {
  int checked = 0;
  for (const Setting* s : settings::all()) {
    Object probe{};
    bool has = false;
    visit_settings(probe, [&](const Setting& t, auto&) { has = has || &t == s; });
    if (!has) continue;
    for (const bool good : {false, true}) {
      for (const Value& v : good ? good_values(*s) : bad_values(*s)) {
        Object o{};
        bool set = false;
        visit_settings(o, [&](const Setting& t, auto& member) {
          if (&t == s) set = assign(member, v.number);
        });
        if (!set) continue;
        SCOPED_TRACE(fmt::format("{}: {}", front, trace(*s, v)));
        std::optional<std::string> field;
        try {
          check_one(o);
        } catch (const InvalidArgument& e) {
          field = e.field();
        }
        if (good) {
          EXPECT_FALSE(field) << "refused, field " << *field;
        } else {
          EXPECT_EQ(field.value_or("(accepted)"), s->name);
        }
        ++checked;
      }
    }
  }
  return checked;
}

TEST(Settings, RequestValidateRefusesTheSameBadValuesAndTakesItsBoundaries) {
  const int n =
      walk_library<Request>("Request::validate", [](const Request& r) { r.validate(100); });
  EXPECT_GT(n, 40);
}

TEST(Settings, ServerCreateRefusesTheSameBadValues) {
  // Bad values only: good ones would bind sockets (the CLI test covers them).
  int checked = 0;
  for (const Setting* s : settings::all()) {
    for (const Value& v : bad_values(*s)) {
      ServerOptions o;
      bool set = false;
      visit_settings(o, [&](const Setting& t, auto& member) {
        if (&t == s) set = assign(member, v.number);
      });
      if (!set) continue;
      SCOPED_TRACE(trace(*s, v));
      try {
        Server::create(o);
        ADD_FAILURE() << "accepted";
      } catch (const InvalidArgument& e) {
        EXPECT_EQ(e.field(), s->name) << e.what();
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(Settings, EngineOptionsValidateUsesTheTable) {
  auto refused = [](EngineOptions o) -> std::string {
    try {
      o.validate();
    } catch (const InvalidArgument& e) {
      return e.field();
    }
    return "(accepted)";
  };
  for (const Setting* s : {&settings::kThreads, &settings::kCtxSize, &settings::kBatchTokens}) {
    auto member = [&](EngineOptions& o) -> int32_t& {
      if (s == &settings::kThreads) return o.threads;
      if (s == &settings::kCtxSize) return o.n_ctx;
      return o.batch_tokens;
    };
    for (const Value& v : bad_values(*s)) {
      EngineOptions o;
      if (!assign(member(o), v.number)) continue;
      if (s == &settings::kThreads && v.number == 0) continue;  // the struct's "every core"
      EXPECT_EQ(refused(o), s->name) << trace(*s, v);
    }
    for (const Value& v : good_values(*s)) {
      EngineOptions o;
      ASSERT_TRUE(assign(member(o), v.number));
      EXPECT_EQ(refused(o), "(accepted)") << trace(*s, v);
    }
  }
  EngineOptions o;
  o.state_dir = "/tmp/unused";
  o.state_max_bytes = (1u << 20) - 1;
  EXPECT_EQ(refused(o), settings::kStateMaxMib.name);
  o.state_max_bytes = 1u << 20;
  EXPECT_EQ(refused(o), "(accepted)");
}

// ---- the docs ---------------------------------------------------------------

TEST(Settings, TheDocsHoldTheTable) {
  const std::string doc = read_file(std::string(ENCORE_SOURCE_DIR) + "/docs/settings.md");
  ASSERT_FALSE(doc.empty());
  const std::string table = settings::markdown_table();
  EXPECT_NE(doc.find(table), std::string::npos)
      << "docs/settings.md is out of date: paste the output of `encore settings` into it:\n"
      << table;
  const CliResult r = run_encore({"settings"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, table);
}

// Defaults come from the table: a default-constructed struct holds them.
TEST(Settings, StructDefaultsAreTheTables) {
  int checked = 0;
  auto same = [&](const Setting& s, const auto& member) {
    using T = std::remove_cvref_t<decltype(member)>;
    // Every setting a struct holds is in settings::all(), so the tests above walk it.
    EXPECT_NE(std::find(settings::all().begin(), settings::all().end(), &s), settings::all().end())
        << s.name;
    if constexpr (std::is_arithmetic_v<T>) {
      EXPECT_EQ(member, static_cast<T>(s.def)) << s.name;
    } else if constexpr (requires { typename T::rep; }) {
      EXPECT_EQ(std::chrono::duration<double>(member).count(), s.def) << s.name;
    } else {
      EXPECT_FALSE(member.has_value()) << s.name;  // the seed: absent is -1, random
    }
    ++checked;
  };
  const Request request;
  const ServerOptions server;
  visit_settings(request, same);
  visit_settings(server, same);
  EXPECT_EQ(checked, 16 + 14);
}

}  // namespace
}  // namespace encore::test
