// The chat-template renderer through its public header (include/encore/jinja.h),
// for what tests/jinja/compare.py cannot see from the outside: the content
// marks (template_ranges), the limits, error lines, refusals, determinism and
// the clock. Every check that something is content or template text is paired
// with one where it must come out the other way, so a renderer that marks
// everything (or nothing) fails.
#include "encore/jinja.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "encore/error.h"

namespace encore::jinja {
namespace {

using json = nlohmann::ordered_json;

Rendered render(std::string_view src, const json& ctx, const RenderOptions& opt = {}) {
  return Template(src).render(ctx, opt);
}

// The ranges hold their documented shape: ascending, disjoint, never
// adjacent, inside the text.
void expect_well_formed(const Rendered& r) {
  size_t at = 0;
  for (size_t k = 0; k < r.template_ranges.size(); ++k) {
    const ByteRange& b = r.template_ranges[k];
    EXPECT_LT(b.begin, b.end) << "empty range " << k;
    if (k > 0) {
      EXPECT_GT(b.begin, at) << "range " << k << " touches or overlaps the previous";
    }
    EXPECT_LE(b.end, r.text.size());
    at = b.end;
  }
}

bool in_template_range(const Rendered& r, size_t pos) {
  for (const ByteRange& b : r.template_ranges) {
    if (pos >= b.begin && pos < b.end) return true;
  }
  return false;
}

// Every byte of the first occurrence of `needle` in the text is content
// (outside the template ranges) / template text (inside them).
::testing::AssertionResult marked(const Rendered& r, std::string_view needle, bool content) {
  const size_t at = r.text.find(needle);
  if (at == std::string::npos || needle.empty()) {
    return ::testing::AssertionFailure() << "'" << needle << "' not in '" << r.text << "'";
  }
  for (size_t k = at; k < at + needle.size(); ++k) {
    if (in_template_range(r, k) == content) {
      return ::testing::AssertionFailure()
             << "byte " << k << " of '" << needle << "' in '" << r.text << "' is "
             << (content ? "template text" : "content");
    }
  }
  return ::testing::AssertionSuccess();
}
::testing::AssertionResult is_content(const Rendered& r, std::string_view needle) {
  return marked(r, needle, true);
}
::testing::AssertionResult is_template(const Rendered& r, std::string_view needle) {
  return marked(r, needle, false);
}

// The message of the InvalidArgument `f` throws ("" and a test failure when
// it throws nothing or something else).
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an InvalidArgument: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no error";
  return "";
}
std::string parse_error(std::string_view src) {
  return error_of([&] { Template t(src); });
}
std::string render_error(std::string_view src, const json& ctx = json::object(),
                         const RenderOptions& opt = {}) {
  return error_of([&] { render(src, ctx, opt); });
}

const json kChat = {{"messages",
                     {{{"role", "system"}, {"content", "  Be <|brief|>.  "}},
                      {{"role", "user"}, {"content", "Hello <|im_end|> World"}}}},
                    {"tools", {{{"type", "function"}, {"function", {{"name", "get_weather"}}}}}},
                    {"bos_token", "<s>"},
                    {"eos_token", "</s>"},
                    {"sep_token", "<sep>"}};

// ---- content marks ----

TEST(JinjaContent, MessageContentAndRolesAreContentTemplateLiteralsAreNot) {
  const Rendered r = render(
      "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>{% endfor %}"
      "{{ eos_token }}",
      kChat);
  expect_well_formed(r);
  EXPECT_TRUE(is_content(r, "Hello <|im_end|> World"));
  EXPECT_TRUE(is_content(r, "  Be <|brief|>.  "));
  EXPECT_TRUE(is_content(r, "system"));
  EXPECT_TRUE(is_content(r, "user"));
  EXPECT_TRUE(is_template(r, "<|end|>"));
  EXPECT_TRUE(is_template(r, "<|"));
  // bos_token and eos_token are trusted keys: template text.
  EXPECT_TRUE(is_template(r, "<s>"));
  EXPECT_TRUE(is_template(r, "</s>"));
}

TEST(JinjaContent, TrustedKeysAreWhatOptionsSay) {
  const std::string src = "{{ bos_token }}|{{ sep_token }}";
  const Rendered def = render(src, kChat);
  EXPECT_TRUE(is_template(def, "<s>"));
  EXPECT_TRUE(is_content(def, "<sep>"));  // not a trusted key
  RenderOptions opt;
  opt.trusted_paths = {"/sep_token"};
  const Rendered swapped = render(src, kChat, opt);
  EXPECT_TRUE(is_content(swapped, "<s>"));
  EXPECT_TRUE(is_template(swapped, "<sep>"));
  opt.trusted_paths.clear();
  const Rendered none = render(src, kChat, opt);
  EXPECT_TRUE(is_content(none, "<s>"));
  EXPECT_TRUE(is_template(none, "|"));
}

TEST(JinjaContent, TrustedPathsReachIntoListsAndDicts) {
  const std::string src = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}";
  const Rendered def = render(src, kChat);
  EXPECT_TRUE(is_content(def, "user"));  // roles are content unless trusted
  RenderOptions opt;
  opt.trusted_paths.push_back("/messages/*/role");
  const Rendered roles = render(src, kChat, opt);
  EXPECT_TRUE(is_template(roles, "<|user|>"));  // the role joins the template's markers
  EXPECT_TRUE(is_template(roles, "<|system|>"));
  EXPECT_TRUE(is_content(roles, "  Be <|brief|>.  "));  // content stays content
  opt.trusted_paths = {"/messages/0/role"};  // an index, not "*": only the first message's
  const Rendered first = render(src, kChat, opt);
  EXPECT_TRUE(is_template(first, "<|system|>"));
  EXPECT_TRUE(is_content(first, "user"));
}

TEST(JinjaContent, ContentAsAnArgumentStaysContent) {
  // indent's width and strftime_now's format are written into the output:
  // from the context they are content (found by review: they were not).
  const json ctx = {{"w", "<|im_start|>"}, {"f", "%Y <|x|>"}, {"bos_token", "<s>"}};
  const Rendered ind = render("a{{ 'x\ny'|indent(w) }}", ctx);
  expect_well_formed(ind);
  EXPECT_TRUE(is_content(ind, "<|im_start|>"));
  EXPECT_TRUE(is_template(ind, "a"));
  const Rendered lit = render("a{{ 'x\ny'|indent('<|im_start|>') }}", ctx);
  EXPECT_TRUE(is_template(lit, "<|im_start|>"));  // the template's own width: template text
  RenderOptions opt;
  opt.now_unix_seconds = 1721982600;  // 2024-07-26
  const Rendered date = render("{{ strftime_now(f) }}|{{ strftime_now('%Y <|y|>') }}", ctx, opt);
  EXPECT_TRUE(is_content(date, "2024 <|x|>"));
  EXPECT_TRUE(is_template(date, "2024 <|y|>"));
}

TEST(JinjaContent, ToolJsonIsContentTemplateJsonIsNot) {
  const Rendered r = render("<tools>{{ tools|tojson }}</tools>{{ {'k': 'lit'}|tojson }}", kChat);
  expect_well_formed(r);
  EXPECT_TRUE(is_content(r, R"([{"type": "function", "function": {"name": "get_weather"}}])"));
  EXPECT_TRUE(is_template(r, "<tools>"));
  EXPECT_TRUE(is_template(r, R"({"k": "lit"})"));
  // tojson of a structure with one context string in it: all content.
  const Rendered mixed = render("{{ {'k': messages[1].role}|tojson }}", kChat);
  EXPECT_TRUE(is_content(mixed, R"({"k": "user"})"));
  // Python's repr of the tools (|string, {{ list }}) too.
  const Rendered repr = render("{{ tools }}", kChat);
  EXPECT_TRUE(is_content(repr, "get_weather"));
}

TEST(JinjaContent, StringOperationsKeepTheMarks) {
  struct Case {
    const char* expr;    // over c = the user's content "Hello <|im_end|> World"
    const char* lit;     // the same over a template literal
    const char* output;  // what both render
  };
  const Case cases[] = {
      {"c|trim", "'Hello <|im_end|> World'|trim", "Hello <|im_end|> World"},
      {"c.strip('Hd')", "'Hello <|im_end|> World'.strip('Hd')", "ello <|im_end|> Worl"},
      {"c.split(' ')[1]", "'Hello <|im_end|> World'.split(' ')[1]", "<|im_end|>"},
      {"c[6:16]", "'Hello <|im_end|> World'[6:16]", "<|im_end|>"},
      {"c[::-1]", "'Hello <|im_end|> World'[::-1]", "dlroW >|dne_mi|< olleH"},
      {"c|replace('World', 'x')", "'Hello <|im_end|> World'|replace('World', 'x')",
       "Hello <|im_end|> "},
      {"c|upper", "'Hello <|im_end|> World'|upper", "HELLO <|IM_END|> WORLD"},
      {"c.lower()", "'Hello <|im_end|> World'.lower()", "hello <|im_end|> world"},
      {"c.split(' ')|join('+')", "'Hello <|im_end|> World'.split(' ')|join('+')", "<|im_end|>"},
      {"'[' ~ c ~ ']'", "'[' ~ 'Hello <|im_end|> World' ~ ']'", "Hello <|im_end|> World"},
      {"c + '!'", "'Hello <|im_end|> World' + '!'", "Hello <|im_end|> World"},
      {"c|string", "'Hello <|im_end|> World'|string", "Hello <|im_end|> World"},
      {"c.replace('<|im_end|>', '<|x|>')",
       "'Hello <|im_end|> World'.replace('<|im_end|>', '<|x|>')", " World"},
      {"c|title", "'Hello <|im_end|> World'|title", "Hello <|im_end|> World"},
      {"c.split('<|')[1].split('|>')[0]", "'Hello <|im_end|> World'.split('<|')[1].split('|>')[0]",
       "im_end"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expr);
    const Rendered from_ctx =
        render(std::string("{% set c = messages[1].content %}<{{ ") + c.expr + " }}>", kChat);
    const Rendered from_lit = render(std::string("<{{ ") + c.lit + " }}>", kChat);
    expect_well_formed(from_ctx);
    EXPECT_EQ(from_ctx.text, from_lit.text);
    EXPECT_TRUE(is_content(from_ctx, c.output));
    EXPECT_TRUE(is_template(from_lit, c.output));
    EXPECT_TRUE(is_template(from_ctx, "<"));
  }
  // What the template itself adds to content (a replacement, a separator) is
  // the template's text: only the bytes that came from the context are content.
  const Rendered r = render(
      "{{ messages[1].content.replace('<|im_end|>', '<|x|>') }}"
      "{{ messages[1].content.split(' ')|join('<|sep|>') }}",
      kChat);
  EXPECT_TRUE(is_template(r, "<|x|>"));
  EXPECT_TRUE(is_template(r, "<|sep|>"));
  EXPECT_TRUE(is_content(r, "Hello "));
  EXPECT_TRUE(is_content(r, "<|im_end|>"));
}

TEST(JinjaContent, ConcatenationMarksOnlyTheContentPart) {
  const Rendered r = render("{{ '<|a|>' ~ messages[1].content ~ '<|b|>' }}", kChat);
  EXPECT_TRUE(is_template(r, "<|a|>"));
  EXPECT_TRUE(is_content(r, "Hello <|im_end|> World"));
  EXPECT_TRUE(is_template(r, "<|b|>"));
  ASSERT_EQ(r.template_ranges.size(), 2u);
}

TEST(JinjaContent, SetBlocksMacrosAndNamespacesKeepTheMarks) {
  const Rendered r = render(
      "{% macro say(x) %}<m>{{ x }}</m>{% endmacro %}"
      "{% set ns = namespace(acc='') %}{% for m in messages %}{% set ns.acc = ns.acc ~ m.role %}"
      "{% endfor %}{% set blk %}[{{ messages[1].content }}]{% endset %}"
      "{{ say(messages[0].role) }}{{ ns.acc }}{{ blk }}",
      kChat);
  EXPECT_TRUE(is_template(r, "<m>"));
  EXPECT_TRUE(is_content(r, "systemuser"));
  EXPECT_TRUE(is_template(r, "["));
  EXPECT_TRUE(is_content(r, "Hello <|im_end|> World"));
}

TEST(JinjaContent, AllTemplateTextIsOneRange) {
  const Rendered r = render("a{{ 'b' }}{% if true %}c{% endif %}{{ 1 + 2 }}", kChat);
  EXPECT_EQ(r.text, "abc3");
  ASSERT_EQ(r.template_ranges.size(), 1u);
  EXPECT_EQ(r.template_ranges[0], (ByteRange{0, 4}));
  const Rendered empty = render("{{ messages[1].content }}", kChat);
  EXPECT_TRUE(empty.template_ranges.empty());
  EXPECT_EQ(render("", kChat).template_ranges.size(), 0u);
}

// ---- limits ----

// The least limit (of the one `set` sets) at which `src` renders, by
// bisection over [1, hi]; 0 when it does not render even at `hi`. Every
// failure below it must name the limit.
uint64_t least_limit(std::string_view src, uint64_t hi,
                     const std::function<void(RenderOptions&, uint64_t)>& set,
                     std::string_view limit_name) {
  const Template t(src);
  auto ok = [&](uint64_t v) {
    RenderOptions opt;
    set(opt, v);
    try {
      t.render(kChat, opt);
      return true;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(limit_name), std::string::npos) << e.what();
      return false;
    }
  };
  if (!ok(hi)) return 0;
  uint64_t lo = 1;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    if (ok(mid)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

TEST(JinjaLimits, MaxStepsEndsAnEndlessRender) {
  RenderOptions small;
  small.limits.max_steps = 1'000'000;
  const std::string e = render_error(
      "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
      kChat, small);
  EXPECT_NE(e.find("max_steps"), std::string::npos) << e;
  EXPECT_NE(e.find("1000000"), std::string::npos) << e;
  // Just under the limit renders, at the limit it does not.
  const std::string src = "{% for i in range(50) %}{{ i }}{% endfor %}";
  const uint64_t least = least_limit(
      src, 100000, [](RenderOptions& o, uint64_t v) { o.limits.max_steps = v; }, "max_steps");
  ASSERT_GT(least, 50u);
  RenderOptions opt;
  opt.limits.max_steps = least;
  EXPECT_EQ(render(src, kChat, opt).text.size(), 90u);
  opt.limits.max_steps = least - 1;
  EXPECT_NE(render_error(src, kChat, opt).find("max_steps"), std::string::npos);
}

TEST(JinjaLimits, MaxOutputBytesEndsAHugeString) {
  for (const char* src : {"{{ 'x' * 100000000 }}", "{{ 'ab' * (2 ** 40) }}",
                          "{% for i in range(1000000) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}"
                          "{% endfor %}",
                          "{% set s = 'x' * 1000000 %}{{ s ~ s ~ s ~ s ~ s ~ s ~ s ~ s ~ s ~ s ~ "
                          "s ~ s ~ s ~ s ~ s ~ s ~ s ~ s }}"}) {
    SCOPED_TRACE(src);
    RenderOptions opt;  // a loop stops sooner at 1 MiB (ASan builds run this too)
    if (std::string(src).find("for") != std::string::npos) opt.limits.max_output_bytes = 1 << 20;
    const std::string e = render_error(src, kChat, opt);
    EXPECT_NE(e.find("max_output_bytes"), std::string::npos) << e;
  }
  // Exactly at the limit renders; one byte under does not.
  RenderOptions opt;
  opt.limits.max_output_bytes = 1000;
  EXPECT_EQ(render("{{ 'x' * 1000 }}", kChat, opt).text.size(), 1000u);
  EXPECT_EQ(render("{{ 'x' * 999 }}!", kChat, opt).text.size(), 1000u);
  EXPECT_NE(render_error("{{ 'x' * 1001 }}", kChat, opt).find("max_output_bytes"),
            std::string::npos);
  EXPECT_NE(render_error("{{ 'x' * 1000 }}!", kChat, opt).find("max_output_bytes"),
            std::string::npos);
}

TEST(JinjaLimits, MaxCallDepthEndsEndlessRecursion) {
  const std::string e =
      render_error("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}", kChat);
  EXPECT_NE(e.find("max_call_depth"), std::string::npos) << e;
  // A recursion 30 deep renders under a limit a little above 30 and fails a
  // little below it: the limit counts the calls.
  const std::string src =
      "{% macro r(n) %}{% if n > 0 %}{{ r(n - 1) }}{% else %}bottom{% endif %}{% endmacro %}"
      "{{ r(30) }}";
  const uint64_t least = least_limit(
      src, 1000,
      [](RenderOptions& o, uint64_t v) { o.limits.max_call_depth = static_cast<int>(v); },
      "max_call_depth");
  EXPECT_GE(least, 31u);
  EXPECT_LE(least, 100u);
  RenderOptions opt;
  opt.limits.max_call_depth = static_cast<int>(least);
  EXPECT_EQ(render(src, kChat, opt).text, "bottom");
}

// ---- errors ----

TEST(JinjaErrors, RuntimeErrorsNameTheTemplateLine) {
  const std::string e = render_error("line 1\n{% set x = 1 %}\n{{ x + 'a' }}\n", kChat);
  EXPECT_EQ(e.rfind("chat template line 3: ", 0), 0u) << e;
  const std::string u = render_error("\n\n\n\n{{ nothing.attr }}", kChat);
  EXPECT_EQ(u.rfind("chat template line 5: ", 0), 0u) << u;
  EXPECT_NE(u.find("'nothing' is undefined"), std::string::npos) << u;
  // In a macro: the line of the error, not of the call.
  const std::string m =
      render_error("{% macro f() %}\n\n{{ 1 // 0 }}{% endmacro %}\n{{ f() }}", kChat);
  EXPECT_EQ(m.rfind("chat template line 3: ", 0), 0u) << m;
}

TEST(JinjaErrors, SyntaxErrorsNameTheLine) {
  EXPECT_EQ(parse_error("a\nb\n{{ 1 + }}").rfind("chat template line 3: ", 0), 0u);
  EXPECT_EQ(parse_error("{% if x %}\n\n").rfind("chat template line ", 0), 0u);
  EXPECT_NE(parse_error("{% if x %}\n\n").find("endif"), std::string::npos);
}

TEST(JinjaErrors, RaiseExceptionCarriesTheMessage) {
  const std::string e = render_error(
      "ok\n{% if messages[0].role == 'system' %}{{ raise_exception('System role "
      "not supported: ' ~ messages[0].role) }}{% endif %}",
      kChat);
  EXPECT_EQ(e, "chat template line 2: raise_exception: System role not supported: system");
  // The same template with another first role renders.
  json other = kChat;
  other["messages"][0]["role"] = "user";
  EXPECT_EQ(render("ok\n{% if messages[0].role == 'system' %}{{ raise_exception('x') }}"
                   "{% endif %}",
                   other)
                .text,
            "ok\n");
}

TEST(JinjaErrors, UnsupportedStatementsAreRefusedWhenParsed) {
  for (const char* src : {"{% include 'x.jinja' %}", "{% extends 'base.jinja' %}",
                          "{% import 'm.jinja' as m %}", "{% from 'm.jinja' import f %}",
                          "{% block b %}{% endblock %}", "{% autoescape true %}{% endautoescape %}",
                          "{% for x in y recursive %}{{ loop(x) }}{% endfor %}", "{% do x %}"}) {
    SCOPED_TRACE(src);
    const std::string e = parse_error(std::string("text\n") + src);
    EXPECT_EQ(e.rfind("chat template line 2: ", 0), 0u) << e;
    EXPECT_TRUE(e.find("not supported") != std::string::npos ||
                e.find("unknown") != std::string::npos)
        << e;
  }
}

TEST(JinjaErrors, UnknownFilterRefusedOutsideAnIfAtRunTimeInside) {
  const std::string e = parse_error("a\n{{ x|from_json }}");
  EXPECT_EQ(e, "chat template line 2: no filter named 'from_json'");
  EXPECT_NE(parse_error("{{ x is frobnicated }}").find("no test named 'frobnicated'"),
            std::string::npos);
  // In an if, jinja2 compiles the template and fails only on that branch.
  const Template t("{% if go %}\n{{ x|from_json }}{% endif %}done");
  EXPECT_EQ(t.render({{"go", false}}, {}).text, "done");
  const std::string r = error_of([&] { t.render({{"go", true}, {"x", "{}"}}, {}); });
  EXPECT_EQ(r.rfind("chat template line 2: ", 0), 0u) << r;
  EXPECT_NE(r.find("from_json"), std::string::npos) << r;
  // ... but not in a for inside the if.
  EXPECT_NE(parse_error("{% if go %}{% for a in b %}{{ a|from_json }}{% endfor %}{% endif %}")
                .find("no filter named"),
            std::string::npos);
}

TEST(JinjaErrors, DeepNestingIsRefusedNotAStackOverflow) {
  const size_t n = 100000;
  const std::vector<std::string> sources = {
      "{{ " + std::string(n, '(') + "1" + std::string(n, ')') + " }}",
      "{{ " + std::string(n, '[') + std::string(n, ']') + " }}",
      "{{ " + std::string(n, '-') + "1 }}",
      [&] {
        std::string s;
        for (size_t k = 0; k < n; ++k) s += "not ";
        return "{{ " + s + "1 }}";
      }(),
      [&] {
        std::string s;
        for (size_t k = 0; k < n / 10; ++k) s += "{% if true %}";
        return s;
      }(),
      [&] {
        std::string s = "{{ 1";
        for (size_t k = 0; k < n; ++k) s += " + 1";
        return s + " }}";
      }(),
      [&] {
        std::string s = "{{ 'x'";
        for (size_t k = 0; k < n; ++k) s += "|trim";
        return s + " }}";
      }(),
      [&] {
        std::string s = "{{ x";
        for (size_t k = 0; k < n; ++k) s += ".a";
        return s + " }}";
      }(),
      [&] {
        std::string s = "{{ x";
        for (size_t k = 0; k < n; ++k) s += "[0]";
        return s + " }}";
      }(),
      [&] {
        std::string s = "{{ f";
        for (size_t k = 0; k < n; ++k) s += "()";
        return s + " }}";
      }(),
      [&] {
        std::string s = "{{ 1";
        for (size_t k = 0; k < n; ++k) s += " if 1 else 1";
        return s + " }}";
      }(),
  };
  for (const std::string& src : sources) {
    SCOPED_TRACE(src.substr(0, 40));
    const std::string e = parse_error(src);
    EXPECT_NE(e.find("nested too deeply"), std::string::npos) << e.substr(0, 200);
  }
  // A modest nesting parses and renders.
  EXPECT_EQ(render("{{ " + std::string(50, '(') + "1" + std::string(50, ')') + " }}", kChat).text,
            "1");
}

// ---- what the fuzzer (fuzz/fuzz_jinja.cpp) and its seeds found ----

TEST(JinjaFuzzFinds, HugeNumbersInIndexesAndFormatFieldsAreErrors) {
  // x.<digits> past 64 bits: stoll threw std::out_of_range through the parser.
  EXPECT_NE(parse_error("{{ x.1111111111111111111111 }}").find("not supported"), std::string::npos);
  EXPECT_EQ(render("{{ [5, 6].1 }}", kChat).text, "6");
  // A format field index past stoul's range.
  EXPECT_NE(render_error("{{ '{99999999999999999999999}'.format(1) }}", kChat).find("out of range"),
            std::string::npos);
  EXPECT_EQ(render("{{ '{1}{0}'.format('a', 'b') }}", kChat).text, "ba");
  // range() stepping past INT64_MAX; a repetition whose size wraps to 0.
  EXPECT_EQ(render("{{ range(0, 9223372036854775807, 4611686018427387904)|list }}", kChat).text,
            "[0, 4611686018427387904]");
  EXPECT_NE(render_error("{{ 'abcd' * 4611686018427387904 }}", kChat).find("max_output_bytes"),
            std::string::npos);
}

TEST(JinjaFuzzFinds, ValuesNestedInALoopAreStoppedBeforeTheStack) {
  // Printing, comparing and freeing recurse through every level: a list
  // wrapped a million times overflowed the stack.
  for (const char* src :
       {"{% set ns = namespace(x=[]) %}{% for i in range(1000000) %}{% set ns.x = [ns.x] %}"
        "{% endfor %}{{ ns.x|length }}",
        "{% set ns = namespace(x={}) %}{% for i in range(1000000) %}{% set ns.x = {'a': ns.x} %}"
        "{% endfor %}{{ ns.x|length }}",
        "{% set ns = namespace(x=[]) %}{% for i in range(1000000) %}"
        "{% set ns.x = [namespace(y=ns.x)] %}{% endfor %}{{ ns.x|length }}",
        "{% set ns = namespace(x=[]) %}{% for i in range(1000000) %}{% set ns.x = [ns.x.count] %}"
        "{% endfor %}{{ ns.x|length }}"}) {
    SCOPED_TRACE(src);
    const std::string e = render_error(src, kChat);
    EXPECT_NE(e.find("nested deeper than"), std::string::npos) << e;
  }
  // 200 levels are fine.
  EXPECT_EQ(render("{% set ns = namespace(x=[]) %}{% for i in range(200) %}{% set ns.x = [ns.x] "
                   "%}{% endfor %}{{ ns.x|length }}",
                   kChat)
                .text,
            "1");
  // A context nested deeper: refused, not recursed into.
  // (2,000 levels, well past the limit of 256: nlohmann::json copies
  // recursively, and 100,000 overflowed the stack of this test under ASan.)
  json deep = json::array();
  for (int k = 0; k < 2000; ++k) deep = json::array({std::move(deep)});
  const std::string e = error_of([&] { render("{{ d|length }}", {{"d", deep}}); });
  EXPECT_NE(e.find("chat template context: 'd'"), std::string::npos) << e;
}

TEST(JinjaFuzzFinds, ANamespaceCannotHoldItself) {
  // A cycle is never freed and prints forever.
  for (const char* src : {"{% set ns = namespace() %}{% set ns.a = ns %}{{ ns }}",
                          "{% set ns = namespace() %}{% set ns.a = [1, {'b': ns}] %}",
                          "{% set ns = namespace() %}{% set l = [ns] %}{% set ns.a = l %}",
                          "{% for x in [1] %}{{ loop.changed(loop) }}{% endfor %}"}) {
    SCOPED_TRACE(src);
    EXPECT_NE(render_error(src, kChat).find("not supported"), std::string::npos);
  }
  // One namespace in another is fine.
  EXPECT_EQ(render("{% set a = namespace(v=1) %}{% set b = namespace(a=a) %}{% set a.v = 2 %}"
                   "{{ b.a.v }}",
                   kChat)
                .text,
            "2");
}

TEST(JinjaFuzzFinds, HugeStringsAndListsAreRefused) {
  for (const char* src :
       {"{{ ('x' * 1000000)|replace('x', 'y' * 1000) }}", "{{ (['x' * 1000000] * 1000)|length }}",
        "{{ ([1] * 10000000)|length }}", "{{ ('x' * 1000000).split('')|length }}"}) {
    SCOPED_TRACE(src);
    const std::string e = render_error(src, kChat);
    EXPECT_EQ(e.rfind("chat template line 1: ", 0), 0u) << e;
  }
  EXPECT_EQ(render("{{ (['x' * 1000] * 1000)|length }}", kChat).text, "1000");
}

TEST(JinjaFuzzFinds, WorkOnLongStringsCountsTowardMaxSteps) {
  // One step per turn let a loop over s[i] (each a scan of s) go quadratic
  // within max_steps: a 1 MB string indexed a million times ran for minutes.
  RenderOptions opt;
  opt.limits.max_steps = 2'000'000;
  for (const char* src :
       {"{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s[i] }}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s[i:i + 1] }}{% endfor %}",
        "{% set s = 'x' * 1000000 %}{% for i in range(100000) %}{{ s[1::1000000] }}{% endfor "
        "%}"}) {
    SCOPED_TRACE(src);
    EXPECT_NE(render_error(src, kChat, opt).find("max_steps"), std::string::npos);
  }
  // Short strings cost about one step a turn, as before.
  EXPECT_EQ(render("{% set s = 'abcdef' %}{% for i in range(60000) %}{{ s[i % 6] }}{% endfor %}",
                   kChat, opt)
                .text.size(),
            60000u);
}

TEST(JinjaFuzzFinds, UniqueIsLinear) {
  // unique compared each item with every kept one: 300k distinct items were
  // 4.5e10 comparisons within one step. Now a set, as jinja2's.
  EXPECT_EQ(render("{{ range(300000)|unique|list|length }}", kChat).text, "300000");
  EXPECT_EQ(render("{{ [1, 1.0, true, 'a', 'A', none]|unique|list }}", kChat).text,
            "[1, 'a', None]");
  EXPECT_NE(render_error("{{ [[1], [1]]|unique|list }}", kChat).find("unhashable type: 'list'"),
            std::string::npos);
}

// ---- determinism and the clock ----

TEST(JinjaDeterminism, SameRenderTwiceIsByteIdentical) {
  const std::string src =
      "{% for m in messages %}{{ m|tojson }}{{ m }}{% endfor %}{{ {'z': 1, 'a': 2, 'm': 3} }}"
      "{% for k, v in {'z': 1, 'a': 2}.items() %}{{ k }}{{ v }}{% endfor %}";
  const Rendered a = render(src, kChat);
  const Rendered b = render(src, kChat);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.template_ranges, b.template_ranges);
  // Dicts keep insertion order (the context's key order, a literal's order).
  EXPECT_NE(a.text.find(R"({"role": "system", "content": )"), std::string::npos) << a.text;
  EXPECT_NE(a.text.find("{'z': 1, 'a': 2, 'm': 3}z1a2"), std::string::npos) << a.text;
  json reordered = {{"d", {{"b", 1}, {"a", 2}}}};
  EXPECT_EQ(render("{{ d|tojson }}{% for k in d %}{{ k }}{% endfor %}", reordered).text,
            R"({"b": 1, "a": 2}ba)");
  reordered = {{"d", {{"a", 2}, {"b", 1}}}};
  EXPECT_EQ(render("{{ d|tojson }}{% for k in d %}{{ k }}{% endfor %}", reordered).text,
            R"({"a": 2, "b": 1}ab)");
}

TEST(JinjaDeterminism, StrftimeNowReadsTheGivenClock) {
  const std::string src = "{{ strftime_now('%Y-%m-%d %H:%M:%S %A %-d %B') }}";
  RenderOptions opt;
  opt.now_unix_seconds = 1721982600;  // 2024-07-26T08:30:00Z
  EXPECT_EQ(render(src, kChat, opt).text, "2024-07-26 08:30:00 Friday 26 July");
  opt.now_unix_seconds = 0;
  EXPECT_EQ(render(src, kChat, opt).text, "1970-01-01 00:00:00 Thursday 1 January");
  opt.now_unix_seconds = 951782400;  // 2000-02-29T00:00:00Z, a leap day
  EXPECT_EQ(render(src, kChat, opt).text, "2000-02-29 00:00:00 Tuesday 29 February");
}

}  // namespace
}  // namespace encore::jinja
