// Jinja2's built-in filters and tests (jinja2/filters.py, jinja2/tests.py),
// transformers' tojson, and the render's globals.
#include "jinja/builtins.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>

#include "jinja/ast.h"
#include "jinja/text.h"

namespace encore::jinja {

namespace {

const char* const kFilters[] = {
    "abs",     "attr",    "capitalize", "count",  "d",      "default",    "dictsort", "e",
    "escape",  "first",   "float",      "indent", "int",    "items",      "join",     "last",
    "length",  "list",    "lower",      "map",    "max",    "min",        "reject",   "rejectattr",
    "replace", "reverse", "round",      "safe",   "select", "selectattr", "sort",     "string",
    "sum",     "title",   "tojson",     "trim",   "unique", "upper",      "wordcount"};

// Jinja2's other built-in filters. A template may name them (jinja2 knows
// them when it compiles), but running one is refused: none of the real chat
// templates uses them, and random (nondeterministic), pprint or urlize have
// no place in a prompt.
const char* const kUnsupportedFilters[] = {
    "batch", "center",    "filesizeformat", "forceescape", "format", "groupby",  "pprint", "random",
    "slice", "striptags", "truncate",       "urlencode",   "urlize", "wordwrap", "xmlattr"};

const char* const kTests[] = {
    "boolean", "callable", "defined",  "divisibleby", "eq",       "equalto", "escaped",
    "even",    "false",    "filter",   "float",       "ge",       "gt",      "greaterthan",
    "in",      "integer",  "iterable", "le",          "lessthan", "lower",   "lt",
    "mapping", "ne",       "none",     "number",      "odd",      "sameas",  "sequence",
    "string",  "test",     "true",     "undefined",   "upper",    "==",      "!=",
    "<",       "<=",       ">",        ">="};

Value arg_or(Args& a, size_t i, std::string_view n, Value def) {
  auto v = a.take(i, n);
  return v ? std::move(*v) : std::move(def);
}

// The attribute path "a.b.0" of an item, as jinja2's make_attrgetter reads it.
Value attr_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t at = 0;
  for (;;) {
    const size_t dot = path.find('.', at);
    const std::string part = path.substr(at, dot == std::string::npos ? dot : dot - at);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = digits && part.size() < 18 ? get_item(v, Value::integer(std::stoll(part)))
                                   : get_item(v, Value::string(part));
    if (dot == std::string::npos) return v;
    at = dot + 1;
  }
}

Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(py_case(v.s.text, "lower"));
  return v;
}

// select / reject / selectattr / rejectattr.
Value select(const Value& v, Args& a, bool attr, bool keep) {
  std::optional<std::string> path;
  size_t first = 0;
  if (attr) {
    if (a.pos.empty() || !a.pos[0].is_string()) fail("selectattr needs an attribute name");
    path = a.pos[0].s.text;
    first = 1;
  }
  std::string test;
  Args test_args;
  if (a.pos.size() > first) {
    if (!a.pos[first].is_string()) fail("the test of select must be a name");
    test = a.pos[first].s.text;
    if (!detail::known_test(test)) fail(fmt::format("no test named '{}'", test));
    test_args.pos.assign(a.pos.begin() + static_cast<long>(first) + 1, a.pos.end());
  }
  test_args.kw = a.kw;
  std::vector<Value> out;
  if (!truthy(v)) return Value::of_iter({});  // jinja2: `if value:` before iterating
  for (const Value& item : iterate(v)) {
    const Value x = path ? attr_path(item, *path) : item;
    Args ta = test_args;
    const bool pass = test.empty() ? truthy(x) : apply_test(test, x, ta);
    if (pass == keep) out.push_back(item);
  }
  return Value::of_iter(std::move(out));
}

Str html_escape(const Str& s) {
  std::string out;
  for (char c : s.text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return s.derived(std::move(out));
}

// Python's float(t) of a stripped string: strtod also reads hex ("0x1A")
// and "nan(...)", which Python refuses.
bool py_float(const std::string& t, double* out) {
  if (t.empty() || t.find_first_of("xXpP()") != std::string::npos) return false;
  try {
    size_t used = 0;
    const double d = std::stod(t, &used);
    if (used != t.size()) return false;
    *out = d;
    return true;
  } catch (const std::exception&) {
    return false;  // not a number; out of range (1e999 is inf in Python: rare enough)
  }
}

// A float's integer part; Python's int() would go past 64 bits, which a
// chat template's integers do not.
Value float_to_int(double d) {
  if (std::fabs(d) >= 9223372036854775808.0) {
    fail("integer overflow: integers beyond 64 bits are not supported");
  }
  return Value::integer(static_cast<int64_t>(d));
}

// jinja2's int filter: int(value, base) for a string, else int(value); then
// int(float(value)); else the default.
Value to_int(const Value& v, const Value& def, int base) {
  switch (v.kind) {
    case Kind::Int:
      return v;
    case Kind::Bool:
      return Value::integer(v.b);
    case Kind::Float:
      if (std::isnan(v.f)) return def;
      if (std::isinf(v.f)) fail("cannot convert float infinity to integer");
      return float_to_int(v.f);
    case Kind::Str: {
      std::string t = py_strip(v.s, nullptr, true, true).text;
      t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
      // Python takes a 0x / 0o / 0b prefix that matches the base (base 0:
      // any, else decimal); strtoll knows only 0x.
      std::string digits = t;
      const size_t sign = !t.empty() && (t[0] == '-' || t[0] == '+') ? 1 : 0;
      if (t.size() > sign + 2 && t[sign] == '0') {
        const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(t[sign + 1])));
        const int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
        if (prefixed && (base == 0 || base == prefixed)) {
          digits = t.substr(0, sign) + t.substr(sign + 2);
          base = prefixed;
        }
      }
      if (base == 0) base = 10;
      if (!digits.empty() && !std::isspace(static_cast<unsigned char>(digits[sign])) && base >= 2 &&
          base <= 36) {
        errno = 0;
        char* end = nullptr;
        const long long i = std::strtoll(digits.c_str(), &end, base);
        if (end == digits.c_str() + digits.size() && end != digits.c_str() + sign) {
          if (errno == ERANGE) fail("integer overflow: integers beyond 64 bits are not supported");
          return Value::integer(i);
        }
      }
      double d = 0;
      if (py_float(t, &d) && std::isfinite(d)) return float_to_int(d);
      return def;
    }
    default:
      return def;
  }
}

Value indent(const Value& v, Args& a) {
  const Value width = arg_or(a, 0, "width", Value::integer(4));
  const bool first = truthy(arg_or(a, 1, "first", Value::boolean(false)));
  const bool blank = truthy(arg_or(a, 2, "blank", Value::boolean(false)));
  a.done("indent", 3);
  // jinja2's do_indent starts with `s += "\n"`: only a string takes it.
  if (!v.is_string()) {
    fail(fmt::format("unsupported operand type(s) for +=: '{}' and 'str'", type_name(v)));
  }
  // A string width keeps its marks: content used as the indentation stays content.
  const Str pad =
      width.is_string()
          ? width.s
          : Str(std::string(static_cast<size_t>(std::clamp<int64_t>(width.i, 0, 1 << 16)), ' '));
  Str s = to_str(v);
  s.append("\n");  // jinja2's quirk for splitlines
  const auto lines = py_splitlines(s.text);
  Str out;
  for (size_t k = 0; k < lines.size(); ++k) {
    const Str line = s.sub(lines[k].first, lines[k].second);
    if (k > 0) {
      out.append("\n");
      if (blank || !line.text.empty()) out.append(pad);
    }
    out.append(line);
  }
  if (first) {
    Str p = pad;
    p.append(out);
    out = std::move(p);
  }
  return Value::string(std::move(out));
}

Value tojson(const Value& v, Args& a) {
  JsonFormat f;
  f.ensure_ascii = truthy(arg_or(a, 0, "ensure_ascii", Value::boolean(false)));
  const Value ind = arg_or(a, 1, "indent", Value::none());
  const Value sep = arg_or(a, 2, "separators", Value::none());
  f.sort_keys = truthy(arg_or(a, 3, "sort_keys", Value::boolean(false)));
  a.done("tojson", 4);
  if (ind.is_string()) {
    f.indent = ind.s.text;
  } else if (ind.kind == Kind::Int) {
    f.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(ind.i, 0, 1 << 10)), ' ');
  } else if (!ind.is_none()) {
    fail("tojson indent must be an int or a string");
  }
  if (!sep.is_none()) {
    if (!sep.is_list() || sep.list->items.size() != 2 || !sep.list->items[0].is_string() ||
        !sep.list->items[1].is_string()) {
      fail("tojson separators must be a pair of strings");
    }
    f.separators = std::make_pair(sep.list->items[0].s.text, sep.list->items[1].s.text);
  }
  return Value::string(to_json(v, f));
}

Value min_max(const Value& v, Args& a, bool want_max) {
  const bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
  const Value attr = arg_or(a, 1, "attribute", Value::none());
  a.done(want_max ? "max" : "min", 2);
  const std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  auto key = [&](size_t k) {
    return sort_key(attr.is_string() ? attr_path(items[k], attr.s.text) : items[k], cs);
  };
  for (size_t k = 1; k < items.size(); ++k) {
    if (want_max ? less(key(best), key(k)) : less(key(k), key(best))) best = k;
  }
  return items[best];
}

}  // namespace

namespace detail {
bool known_filter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) != std::end(kFilters) ||
         std::find(std::begin(kUnsupportedFilters), std::end(kUnsupportedFilters), name) !=
             std::end(kUnsupportedFilters);
}
bool known_test(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) != std::end(kTests);
}
}  // namespace detail

Value apply_filter(std::string_view name, const Value& v, Args& a) {
  const std::string n(name);
  if (std::find(std::begin(kUnsupportedFilters), std::end(kUnsupportedFilters), n) !=
      std::end(kUnsupportedFilters)) {
    fail(fmt::format("the filter '{}' is not supported in chat templates", n));
  }
  if (n == "tojson") return tojson(v, a);
  if (n == "indent") return indent(v, a);
  if (n == "default" || n == "d") {
    const Value def = arg_or(a, 0, "default_value", Value::string(""));
    const bool boolean = truthy(arg_or(a, 1, "boolean", Value::boolean(false)));
    a.done(n, 2);
    return v.is_undefined() || (boolean && !truthy(v)) ? def : v;
  }
  if (n == "length" || n == "count") {
    a.done(n, 0);
    return Value::integer(length(v));
  }
  if (n == "string") {
    a.done(n, 0);
    return Value::string(to_str(v));
  }
  if (n == "trim") {
    const Value chars = arg_or(a, 0, "chars", Value::none());
    a.done(n, 1);
    return Value::string(
        py_strip(to_str(v), chars.is_string() ? &chars.s.text : nullptr, true, true));
  }
  if (n == "upper" || n == "lower" || n == "capitalize" || n == "title") {
    a.done(n, 0);
    const Str s = to_str(v);
    if (n == "title") {
      // jinja2's do_title: words begin after - ( { [ < or whitespace.
      std::string out;
      bool start = true;
      for (const Value& ch : iterate(Value::string(s.text))) {
        const std::string& c = ch.s.text;
        const bool sep = c.size() == 1 && (c[0] == '-' || c[0] == '(' || c[0] == '{' ||
                                           c[0] == '[' || c[0] == '<' || is_space_byte(c[0]));
        out += sep ? c : py_case(c, start ? "upper" : "lower");
        start = sep;
      }
      return Value::string(s.derived(std::move(out)));
    }
    return Value::string(s.derived(py_case(s.text, n)));
  }
  if (n == "replace") {
    const auto old_v = a.take(0, "old"), new_v = a.take(1, "new"), count = a.take(2, "count");
    a.done(n, 3);
    if (!old_v || !new_v) fail("replace needs old and new");
    const Str s = to_str(v), o = to_str(*old_v), nw = to_str(*new_v);
    return Value::string(
        py_replace(s, o.text, nw, count && count->kind == Kind::Int ? count->i : -1));
  }
  if (n == "safe") {
    a.done(n, 0);
    Value s = v.is_string() ? v : Value::string(to_str(v));
    s.b = true;
    return s;
  }
  if (n == "escape" || n == "e") {
    a.done(n, 0);
    if (v.is_markup()) return v;
    Value s = Value::string(html_escape(to_str(v)));
    s.b = true;
    return s;
  }
  if (n == "join") {
    const Value sep = arg_or(a, 0, "d", Value::string(""));
    const Value attr = arg_or(a, 1, "attribute", Value::none());
    a.done(n, 2);
    Str out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out.append(to_str(sep));
      first = false;
      out.append(to_str(attr.is_string() ? attr_path(item, attr.s.text) : item));
    }
    return Value::string(std::move(out));
  }
  if (n == "list") {
    a.done(n, 0);
    return Value::of_list(iterate(v));
  }
  if (n == "first" || n == "last") {
    a.done(n, 0);
    const std::vector<Value> items = iterate(v);
    if (n == "last" && v.is_iter()) fail("'generator' object is not reversible");
    if (items.empty()) return Value::undefined(fmt::format("No {} item, sequence was empty.", n));
    return n == "first" ? items.front() : items.back();
  }
  if (n == "reverse") {
    a.done(n, 0);
    if (v.is_string()) {
      return slice(v, Value::none(), Value::none(), Value::integer(-1));
    }
    // A generator is not reversible: jinja2 then reverses list(value).
    std::vector<Value> items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::of_iter(std::move(items));
  }
  if (n == "items") {
    a.done(n, 0);
    if (v.is_undefined()) return Value::of_iter({});  // a generator in jinja2 too
    if (v.kind != Kind::Dict) fail("Can only get item pairs from a mapping.");
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::of_list({k, x}, true));
    return Value::of_iter(std::move(out));
  }
  if (n == "dictsort") {
    const bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
    const Value by = arg_or(a, 1, "by", Value::string("key"));
    const bool rev = truthy(arg_or(a, 2, "reverse", Value::boolean(false)));
    a.done(n, 3);
    if (v.kind != Kind::Dict) fail("You can only sort by either \"key\" or \"value\" of a dict");
    const size_t pos = by.is_string() && by.s.text == "value" ? 1 : 0;
    std::vector<Value> out;
    for (const auto& [k, x] : v.dict->items) out.push_back(Value::of_list({k, x}, true));
    std::stable_sort(out.begin(), out.end(), [&](const Value& l, const Value& r) {
      const Value a1 = sort_key(l.list->items[pos], cs), b1 = sort_key(r.list->items[pos], cs);
      return rev ? less(b1, a1) : less(a1, b1);
    });
    return Value::of_list(std::move(out));
  }
  if (n == "sort") {
    const bool rev = truthy(arg_or(a, 0, "reverse", Value::boolean(false)));
    const bool cs = truthy(arg_or(a, 1, "case_sensitive", Value::boolean(false)));
    const Value attr = arg_or(a, 2, "attribute", Value::none());
    a.done(n, 3);
    // The keys once each, then a stable sort of (key, item).
    std::vector<std::pair<Value, Value>> keyed;
    for (Value& x : iterate(v)) {
      Value k = sort_key(attr.is_string() ? attr_path(x, attr.s.text) : x, cs);
      keyed.emplace_back(std::move(k), std::move(x));
    }
    // With an attribute jinja2 compares lists of keys ([k] < [k2]), which
    // tests == first: two missing attributes are equal, not an error.
    auto lt = [&](const Value& l, const Value& r) {
      if (attr.is_string() && l.is_undefined() && r.is_undefined()) return false;
      return less(l, r);
    };
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& l, const auto& r) {
      return rev ? lt(r.first, l.first) : lt(l.first, r.first);
    });
    std::vector<Value> items;
    for (auto& [k, x] : keyed) items.push_back(std::move(x));
    return Value::of_list(std::move(items));
  }
  if (n == "unique") {
    const bool cs = truthy(arg_or(a, 0, "case_sensitive", Value::boolean(false)));
    const Value attr = arg_or(a, 1, "attribute", Value::none());
    a.done(n, 2);
    // A set of the keys seen, as jinja2's: one lookup per item (not a scan
    // of all the others), and a list or dict key is unhashable, as in Python.
    std::vector<Value> out;
    Dict seen;
    bool seen_undefined = false;  // jinja2's Undefined hashes and compares as one value
    for (const Value& x : iterate(v)) {
      Value k = sort_key(attr.is_string() ? attr_path(x, attr.s.text) : x, cs);
      if (k.is_undefined()) {
        if (!seen_undefined) out.push_back(x);
        seen_undefined = true;
        continue;
      }
      if (!seen.find(k)) {
        seen.set(std::move(k), Value::none());
        out.push_back(x);
      }
    }
    return Value::of_iter(std::move(out));
  }
  if (n == "map") {
    std::vector<Value> out;
    const auto attr = a.take(99, "attribute");
    if (attr) {
      const Value def = arg_or(a, 99, "default", Value::undefined());
      a.done(n, 0);
      if (!attr->is_string()) fail("map attribute must be a string");
      if (!truthy(v)) return Value::of_iter({});
      for (const Value& x : iterate(v)) {
        Value y = attr_path(x, attr->s.text);
        out.push_back(y.is_undefined() && !def.is_undefined() ? def : y);
      }
      return Value::of_iter(std::move(out));
    }
    if (a.pos.empty() || !a.pos[0].is_string()) fail("map needs a filter name or attribute=");
    const std::string f = a.pos[0].s.text;
    if (!detail::known_filter(f)) fail(fmt::format("no filter named '{}'", f));
    if (!truthy(v)) return Value::of_iter({});
    for (const Value& x : iterate(v)) {
      Args fa;
      fa.pos.assign(a.pos.begin() + 1, a.pos.end());
      fa.kw = a.kw;
      out.push_back(apply_filter(f, x, fa));
    }
    return Value::of_iter(std::move(out));
  }
  if (n == "select" || n == "reject") return select(v, a, false, n == "select");
  if (n == "selectattr" || n == "rejectattr") return select(v, a, true, n == "selectattr");
  if ((n == "int" || n == "float") && v.is_undefined()) {
    fail(undefined_message(v));  // int(Undefined) raises in jinja2, unlike int('x')
  }
  if (n == "int") {
    const Value def = arg_or(a, 0, "default", Value::integer(0));
    const Value base = arg_or(a, 1, "base", Value::integer(10));
    a.done(n, 2);
    return to_int(
        v, def, base.kind == Kind::Int ? static_cast<int>(std::clamp<int64_t>(base.i, 0, 37)) : 10);
  }
  if (n == "float") {
    const Value def = arg_or(a, 0, "default", Value::number(0.0));
    a.done(n, 1);
    if (v.kind == Kind::Float) return v;
    if (v.is_number()) return Value::number(static_cast<double>(as_int(v)));
    if (v.is_string()) {
      std::string t = py_strip(v.s, nullptr, true, true).text;
      t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
      double d = 0;
      if (py_float(t, &d)) return Value::number(d);
    }
    return def;
  }
  if (n == "abs") {
    a.done(n, 0);
    if (v.kind == Kind::Float) return Value::number(std::fabs(v.f));
    if (v.is_number()) {
      const int64_t i = as_int(v);
      if (i == INT64_MIN) fail("integer overflow: integers beyond 64 bits are not supported");
      return Value::integer(i < 0 ? -i : i);
    }
    fail(fmt::format("bad operand type for abs(): '{}'", type_name(v)));
  }
  if (n == "round") {
    const Value prec = arg_or(a, 0, "precision", Value::integer(0));
    const Value method = arg_or(a, 1, "method", Value::string("common"));
    a.done(n, 2);
    if (!v.is_number()) fail("round needs a number");
    const double x = as_double(v);
    const int digits = static_cast<int>(std::clamp<int64_t>(prec.i, -30, 30));
    const std::string how = method.is_string() ? method.s.text : "common";
    if (how != "common" && how != "ceil" && how != "floor") {
      fail("method must be 'common', 'ceil' or 'floor'");
    }
    if (how == "common") {
      // Python's round(x, n): an int stays an int (n >= 0), a float is
      // rounded on its exact binary value, ties to even: printf's %.nf is
      // exactly that, and reading it back gives the nearest double as
      // Python's does.
      if (v.kind != Kind::Float && digits >= 0) return Value::integer(as_int(v));
      if (digits >= 0 && std::isfinite(x)) {
        return Value::number(std::strtod(fmt::format("{:.{}f}", x, digits).c_str(), nullptr));
      }
    }
    const double m = std::pow(10.0, static_cast<double>(digits));
    const double r = how == "ceil"    ? std::ceil(x * m)
                     : how == "floor" ? std::floor(x * m)
                                      : std::nearbyint(x * m);
    return Value::number(r / m);
  }
  if (n == "sum") {
    const Value attr = arg_or(a, 0, "attribute", Value::none());
    Value total = arg_or(a, 1, "start", Value::integer(0));
    a.done(n, 2);
    for (const Value& x : iterate(v)) {
      const Value y = attr.is_string() ? attr_path(x, attr.s.text) : x;
      if (total.is_list() && y.is_list() && !total.is_iter() && !y.is_iter()) {
        // Python's sum adds with +: lists concatenate (sum(ls, start=[])).
        std::vector<Value> items = total.list->items;
        if (items.size() + y.list->items.size() > kMaxListItems) {
          fail(fmt::format("a list of more than {} items", kMaxListItems));
        }
        items.insert(items.end(), y.list->items.begin(), y.list->items.end());
        total = Value::of_list(std::move(items), total.list->tuple);
        continue;
      }
      if (!y.is_number() || !total.is_number()) {
        fail(fmt::format("unsupported operand type(s) for +: '{}' and '{}'", type_name(total),
                         type_name(y)));
      }
      if (total.kind == Kind::Float || y.kind == Kind::Float) {
        auto d = [](const Value& q) { return as_double(q); };
        total = Value::number(d(total) + d(y));
      } else {
        int64_t out;
        if (__builtin_add_overflow(total.i, as_int(y), &out)) {
          fail("integer overflow: integers beyond 64 bits are not supported");
        }
        total = Value::integer(out);
      }
    }
    return total;
  }
  if (n == "min" || n == "max") return min_max(v, a, n == "max");
  if (n == "attr") {
    const auto name_v = a.take(0, "name");
    a.done(n, 1);
    if (!name_v || !name_v->is_string()) fail("attr needs a name");
    return get_attr(v, name_v->s.text);
  }
  if (n == "wordcount") {
    a.done(n, 0);
    // jinja2 counts matches of \w+: runs of str.isalnum() characters and '_'
    // (an emoji is not one: '😀a🎉b' is two words).
    const Str s = to_str(v);
    const std::vector<size_t> offs = code_point_offsets(s.text);
    int64_t words = 0;
    bool in = false;
    for (size_t k = 0; k + 1 < offs.size(); ++k) {
      const std::string_view c(s.text.data() + offs[k], offs[k + 1] - offs[k]);
      const bool w = c == "_" || py_is(c, "isalnum");
      if (w && !in) ++words;
      in = w;
    }
    return Value::integer(words);
  }
  fail(fmt::format("no filter named '{}'", n));
}

bool apply_test(std::string_view name, const Value& v, Args& a) {
  const std::string n(name);
  auto other = [&]() {
    auto x = a.take(0, "other");
    if (!x) fail(fmt::format("the test '{}' needs an argument", n));
    return *x;
  };
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "string") return v.is_string();
  if (n == "number") return v.is_number();
  if (n == "integer") return v.kind == Kind::Int;
  if (n == "float") return v.kind == Kind::Float;
  if (n == "boolean") return v.kind == Kind::Bool;
  if (n == "true") return v.kind == Kind::Bool && v.b;
  if (n == "false") return v.kind == Kind::Bool && !v.b;
  if (n == "mapping") return v.kind == Kind::Dict;
  if (n == "iterable")
    return v.is_undefined() || v.is_string() || v.is_list() || v.kind == Kind::Dict;
  if (n == "sequence")
    return v.is_undefined() || v.is_string() || v.is_list() || v.kind == Kind::Dict;
  if (n == "callable") return v.kind == Kind::Func;
  if (n == "escaped") return false;
  // jinja2: value % 2 == 1, value % 2 == 0, value % num == 0, with Python's
  // % (floats too: 2.5 is neither odd nor even, -0.0 is even).
  auto py_fmod = [](double a, double b) {
    double m = std::fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
  };
  if ((n == "odd" || n == "even") && v.kind == Kind::Float) {
    return py_fmod(v.f, 2.0) == (n == "odd" ? 1.0 : 0.0);
  }
  if (n == "odd" || n == "even") {
    if (v.kind != Kind::Int && v.kind != Kind::Bool) {
      fail(fmt::format("unsupported operand type(s) for %: '{}' and 'int'", type_name(v)));
    }
    const int64_t i = as_int(v);
    return (i % 2 != 0) == (n == "odd");
  }
  if (n == "divisibleby") {
    const Value d = other();
    if (v.is_number() && d.is_number() && (d.kind == Kind::Float || v.kind == Kind::Float)) {
      auto dbl = [](const Value& x) { return as_double(x); };
      if (dbl(d) == 0) fail("float modulo");
      return py_fmod(dbl(v), dbl(d)) == 0;
    }
    if (!v.is_number() || !d.is_number()) {
      fail(fmt::format("unsupported operand type(s) for %: '{}' and '{}'", type_name(v),
                       type_name(d)));
    }
    const int64_t x = as_int(v), y = as_int(d);
    if (y == 0) fail("integer division or modulo by zero");
    return y == -1 || x % y == 0;
  }
  if (n == "eq" || n == "equalto" || n == "==") return equals(v, other());
  if (n == "ne" || n == "!=") return !equals(v, other());
  if (n == "lt" || n == "lessthan" || n == "<") return less(v, other());
  if (n == "gt" || n == "greaterthan" || n == ">") return less(other(), v);
  if (n == "le" || n == "<=") return !less(other(), v);
  if (n == "ge" || n == ">=") return !less(v, other());
  if (n == "in") {
    const Value c = other();
    if (c.is_string() && v.is_string()) return c.s.text.find(v.s.text) != std::string::npos;
    if (c.is_list()) {
      return std::any_of(c.list->items.begin(), c.list->items.end(),
                         [&](const Value& x) { return equals(x, v); });
    }
    if (c.kind == Kind::Dict) return c.dict->find(v) != nullptr;
    fail(fmt::format("argument of type '{}' is not iterable", type_name(c)));
  }
  if (n == "sameas") {
    const Value o = other();
    if (v.kind != o.kind) return false;
    switch (v.kind) {
      case Kind::None:
      case Kind::Undefined:
        return true;
      case Kind::Bool:
        return v.b == o.b;
      case Kind::List:
        return v.list == o.list;
      case Kind::Dict:
      case Kind::Namespace:
        return v.dict == o.dict;
      case Kind::Func:
        return v.func == o.func;
      default:
        return equals(v, o);  // small ints and interned strings in CPython
    }
  }
  if (n == "lower" || n == "upper") {
    return py_is(to_str(v).text, n == "lower" ? "islower" : "isupper");
  }
  if (n == "filter") return v.is_string() && detail::known_filter(v.s.text);
  if (n == "test") return v.is_string() && detail::known_test(v.s.text);
  fail(fmt::format("no test named '{}'", n));
}

Dict make_globals(int64_t now_unix_seconds) {
  Dict g;
  g.set(Str("namespace"), Value::function("namespace", [](Args& a) {
          Dict d;
          for (const Value& p : a.pos) {
            if (p.kind != Kind::Dict) fail("namespace() takes keyword arguments or a dict");
            for (const auto& [k, v] : p.dict->items) {
              if (!k.is_string()) fail("namespace() keywords must be strings");
              d.set_in_namespace(k.s, v);
            }
          }
          for (auto& [k, v] : a.kw) d.set_in_namespace(Str(k), std::move(v));
          return Value::of_namespace(std::move(d));
        }));
  g.set(Str("dict"), Value::function("dict", [](Args& a) {
          // dict(mapping or pairs, **kwargs), as Python's dict().
          if (a.pos.size() > 1) fail("dict expected at most 1 argument");
          Dict d;
          if (!a.pos.empty() && a.pos[0].is_mapping()) {
            d = *a.pos[0].dict;
          } else if (!a.pos.empty()) {
            for (const Value& pair : iterate(a.pos[0])) {
              if (!pair.is_list() || pair.list->items.size() != 2) {
                fail("dictionary update sequence element has the wrong length; 2 is required");
              }
              d.set(pair.list->items[0], pair.list->items[1]);
            }
          }
          for (auto& [k, v] : a.kw) d.set(Str(k), std::move(v));
          return Value::of_dict(std::move(d));
        }));
  g.set(Str("range"), Value::function("range", [](Args& a) {
          a.done("range", 3);
          std::vector<int64_t> p;
          for (const Value& v : a.pos) {
            if (v.kind != Kind::Int && v.kind != Kind::Bool) fail("range() needs integers");
            p.push_back(as_int(v));
          }
          if (p.empty()) fail("range expected at least 1 argument, got 0");
          const int64_t start = p.size() > 1 ? p[0] : 0, stop = p.size() > 1 ? p[1] : p[0];
          const int64_t step = p.size() > 2 ? p[2] : 1;
          if (step == 0) fail("range() arg 3 must not be zero");
          // The count first, in 128 bits: stepping k itself past INT64_MAX
          // would overflow (range(0, 2**62 * 2 - 1, 2**62)).
          using Wide = __int128;
          const Wide span = step > 0 ? Wide{stop} - start : Wide{start} - stop;
          const Wide stride = step > 0 ? Wide{step} : -Wide{step};
          const Wide count = span > 0 ? (span - 1) / stride + 1 : 0;
          if (count > static_cast<Wide>(kMaxListItems)) {
            fail(fmt::format("range() of more than {} numbers", kMaxListItems));
          }
          std::vector<Value> out;
          out.reserve(static_cast<size_t>(count));
          for (Wide k = 0; k < count; ++k) {
            out.push_back(Value::integer(static_cast<int64_t>(start + k * step)));
          }
          return Value::of_view(std::move(out),
                                p.size() > 2 ? fmt::format("range({}, {}, {})", start, stop, step)
                                             : fmt::format("range({}, {})", start, stop));
        }));
  g.set(Str("raise_exception"), Value::function("raise_exception", [](Args& a) -> Value {
          fail(std::string(kRaisePrefix) + (a.pos.empty() ? "" : to_str(a.pos[0]).text));
        }));
  g.set(Str("strftime_now"), Value::function("strftime_now", [now_unix_seconds](Args& a) {
          if (a.pos.empty() || !a.pos[0].is_string()) fail("strftime_now needs a format string");
          // A format from the context makes the whole date content.
          return Value::string(a.pos[0].s.derived(strftime_utc(a.pos[0].s.text, now_unix_seconds)));
        }));
  return g;
}

}  // namespace encore::jinja
