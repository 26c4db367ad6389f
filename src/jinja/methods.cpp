// Attribute, item and slice lookup, calls, and the methods of str, list and
// dict that templates call (s.split(...), d.items(), d.get(k, default) ...),
// with Python's semantics; string positions count code points.
#include <fmt/format.h>

#include <algorithm>

#include "jinja/builtins.h"
#include "jinja/text.h"

namespace encore::jinja {

namespace {

// An undefined that fails when called: what the immutable sandbox gives for
// a method that would change a list or dict.
Value unsafe(std::string_view type, std::string_view name) {
  Value v = Value::undefined(
      fmt::format("access to attribute '{}' of '{}' object is unsafe.", name, type));
  v.b = true;
  return v;
}

const std::string& want_str(const Value& v, std::string_view what) {
  if (!v.is_string()) fail(fmt::format("{} must be str, not {}", what, type_name(v)));
  return v.s.text;
}

int64_t want_int(const Value& v, std::string_view what) {
  if (v.kind == Kind::Int) return v.i;
  if (v.kind == Kind::Bool) return v.b;
  fail(fmt::format("{} must be an integer, not {}", what, type_name(v)));
}

// Python's s.split(sep, maxsplit), s.rsplit when `reverse`.
Value split(const Str& s, const std::optional<Value>& sep_v, int64_t maxsplit, bool reverse) {
  std::vector<Value> parts;
  const std::string& t = s.text;
  if (!sep_v || sep_v->is_none()) {
    // Runs of whitespace separate; empty strings never result.
    std::vector<std::pair<size_t, size_t>> words;
    const auto offs = code_point_offsets(t);
    size_t k = 0;
    const size_t n = offs.size() - 1;
    auto space_at = [&](size_t i) { return is_py_space(decode_cp(t, offs[i], offs[i + 1])); };
    while (k < n) {
      while (k < n && space_at(k)) ++k;
      if (k == n) break;
      const size_t b = k;
      while (k < n && !space_at(k)) ++k;
      words.emplace_back(offs[b], offs[k]);
    }
    if (maxsplit >= 0 && static_cast<int64_t>(words.size()) > maxsplit) {
      // The last (or, reversed, first) part is the rest of the string as it
      // stands: from its first word to the end, whitespace and all
      // ('  x y  '.split(None, 1) is ['x', 'y  ']).
      if (!reverse) {
        const size_t from = words[static_cast<size_t>(maxsplit)].first;
        const size_t to = t.size();
        words.resize(static_cast<size_t>(maxsplit));
        words.emplace_back(from, to);
      } else {
        const size_t cut = words.size() - static_cast<size_t>(maxsplit);
        const size_t to = words[cut - 1].second;
        const size_t from = 0;
        std::vector<std::pair<size_t, size_t>> kept{{from, to}};
        kept.insert(kept.end(), words.begin() + static_cast<long>(cut), words.end());
        words = std::move(kept);
      }
    }
    for (const auto& [b, e] : words) parts.push_back(Value::string(s.sub(b, e)));
    return Value::of_list(std::move(parts));
  }
  const std::string& sep = want_str(*sep_v, "split() separator");
  if (sep.empty()) fail("empty separator");
  std::vector<std::pair<size_t, size_t>> pieces;
  if (!reverse) {
    size_t at = 0;
    for (int64_t k = 0; maxsplit < 0 || k < maxsplit; ++k) {
      const size_t p = t.find(sep, at);
      if (p == std::string::npos) break;
      pieces.emplace_back(at, p);
      at = p + sep.size();
    }
    pieces.emplace_back(at, t.size());
  } else {
    size_t end = t.size();
    for (int64_t k = 0; maxsplit < 0 || k < maxsplit; ++k) {
      if (end < sep.size()) break;
      const size_t p = t.rfind(sep, end - sep.size());
      if (p == std::string::npos) break;
      pieces.emplace_back(p + sep.size(), end);
      end = p;
    }
    pieces.emplace_back(0, end);
    std::reverse(pieces.begin(), pieces.end());
  }
  for (const auto& [b, e] : pieces) parts.push_back(Value::string(s.sub(b, e)));
  return Value::of_list(std::move(parts));
}

bool affix(const Str& s, const Value& arg, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& x = want_str(a, prefix ? "startswith() argument" : "endswith() argument");
    if (x.size() > s.text.size()) return false;
    return prefix ? s.text.compare(0, x.size(), x) == 0
                  : s.text.compare(s.text.size() - x.size(), x.size(), x) == 0;
  };
  if (arg.is_list()) return std::any_of(arg.list->items.begin(), arg.list->items.end(), one);
  return one(arg);
}

// str.format with {} {0} {name} fields and {{ }} escapes (no format specs).
Value format(const Str& s, const Args& a) {
  Str out;
  const std::string& t = s.text;
  size_t auto_index = 0;
  for (size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if ((c == '{' || c == '}') && i + 1 < t.size() && t[i + 1] == c) {
      out.append(s.sub(i, i + 1));
      ++i;
      continue;
    }
    if (c == '}') fail("Single '}' encountered in format string");
    if (c != '{') {
      out.append(s.sub(i, i + 1));
      continue;
    }
    const size_t close = t.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    const std::string field = t.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) {
      fail("format fields with specs, conversions or lookups are not supported");
    }
    const Value* v = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      // Nine digits at most: stoul would throw past its range.
      const size_t k = field.empty()      ? auto_index++
                       : field.size() > 9 ? a.pos.size()
                                          : std::stoul(field);
      if (k >= a.pos.size()) fail("Replacement index out of range for positional args tuple");
      v = &a.pos[k];
    } else {
      for (const auto& [n, x] : a.kw) {
        if (n == field) v = &x;
      }
      if (!v) fail(fmt::format("KeyError: '{}'", field));
    }
    out.append(to_str(*v));
    i = close;
  }
  return Value::string(std::move(out));
}

int64_t find(const Str& s, const std::string& sub, bool reverse) {
  const size_t p = reverse ? s.text.rfind(sub) : s.text.find(sub);
  if (p == std::string::npos) return -1;
  return static_cast<int64_t>(count_code_points(std::string_view(s.text).substr(0, p)));
}

Value str_method(const Value& self, const std::string& name, Args& a) {
  const Str& s = self.s;
  auto arg = [&](size_t i, std::string_view n) { return a.take(i, n); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const auto chars = arg(0, "chars");
    a.done(name, 1);
    const bool left = name != "rstrip", right = name != "lstrip";
    return Value::string(py_strip(
        s, chars && !chars->is_none() ? &want_str(*chars, "strip arg") : nullptr, left, right));
  }
  if (name == "split" || name == "rsplit") {
    const auto sep = arg(0, "sep");
    const auto maxsplit = arg(1, "maxsplit");
    a.done(name, 2);
    return split(s, sep, maxsplit ? want_int(*maxsplit, "maxsplit") : -1, name == "rsplit");
  }
  if (name == "splitlines") {
    a.done(name, 0);
    std::vector<Value> lines;
    for (const auto& [b, e] : py_splitlines(s.text)) lines.push_back(Value::string(s.sub(b, e)));
    return Value::of_list(std::move(lines));
  }
  if (name == "startswith" || name == "endswith") {
    const auto x = arg(0, "prefix"), start = arg(1, "start"), end = arg(2, "end");
    a.done(name, 3);
    if (!x) fail(fmt::format("{}() takes at least 1 argument", name));
    if (!start && !end) return Value::boolean(affix(s, *x, name == "startswith"));
    // s[start:end] (code points, Python's slice rules), then the test.
    const Value part = slice(Value::string(s), start ? *start : Value::none(),
                             end ? *end : Value::none(), Value::none());
    return Value::boolean(affix(part.s, *x, name == "startswith"));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
      name == "casefold" || name == "swapcase") {
    a.done(name, 0);
    return Value::string(s.derived(py_case(s.text, name)));
  }
  if (name == "replace") {
    const auto old_v = arg(0, "old"), new_v = arg(1, "new"), count = arg(2, "count");
    a.done(name, 3);
    if (!old_v || !new_v) fail("replace() takes at least 2 arguments");
    want_str(*new_v, "replace() argument 2");
    return Value::string(py_replace(s, want_str(*old_v, "replace() argument 1"), new_v->s,
                                    count ? want_int(*count, "count") : -1));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    const auto sub = arg(0, "sub");
    a.done(name, 1);
    if (!sub) fail(fmt::format("{}() takes at least 1 argument", name));
    const int64_t at = find(s, want_str(*sub, "argument"), name[0] == 'r');
    if (at < 0 && name.find("index") != std::string::npos) fail("substring not found");
    return Value::integer(at);
  }
  if (name == "count") {
    const auto sub = arg(0, "sub");
    a.done(name, 1);
    if (!sub) fail("count() takes at least 1 argument");
    const std::string& x = want_str(*sub, "argument");
    if (x.empty()) return Value::integer(static_cast<int64_t>(count_code_points(s.text)) + 1);
    int64_t n = 0;
    for (size_t p = s.text.find(x); p != std::string::npos; p = s.text.find(x, p + x.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const auto items = arg(0, "iterable");
    a.done(name, 1);
    if (!items) fail("join() takes exactly one argument");
    Str out;
    bool first = true;
    for (const Value& v : iterate(*items)) {
      if (!v.is_string())
        fail(fmt::format("sequence item: expected str instance, {} found", type_name(v)));
      if (!first) out.append(s);
      first = false;
      out.append(v.s);
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return format(s, a);
  if (name == "removeprefix" || name == "removesuffix") {
    const auto x = arg(0, "affix");
    a.done(name, 1);
    if (!x) fail(fmt::format("{}() takes exactly one argument", name));
    const std::string& t = want_str(*x, "argument");
    if (affix(s, *x, name == "removeprefix")) {
      return Value::string(name == "removeprefix" ? s.sub(t.size(), s.text.size())
                                                  : s.sub(0, s.text.size() - t.size()));
    }
    return self;
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "isupper" || name == "islower" || name == "isnumeric" || name == "isdecimal") {
    a.done(name, 0);
    return Value::boolean(py_is(s.text, name));
  }
  fail(fmt::format("str.{}() is not supported in chat templates", name));
}

bool is_str_method(std::string_view n) {
  static const char* const names[] = {
      "strip",      "lstrip",     "rstrip",  "split",      "rsplit",       "splitlines",
      "startswith", "endswith",   "upper",   "lower",      "title",        "capitalize",
      "casefold",   "swapcase",   "replace", "find",       "rfind",        "index",
      "rindex",     "count",      "join",    "format",     "removeprefix", "removesuffix",
      "isdigit",    "isalpha",    "isalnum", "isspace",    "isupper",      "islower",
      "isnumeric",  "isdecimal",  "zfill",   "center",     "ljust",        "rjust",
      "partition",  "rpartition", "encode",  "expandtabs", "istitle",      "format_map"};
  return std::find(std::begin(names), std::end(names), n) != std::end(names);
}

Value bound(const Value& self, std::string name,
            Value (*method)(const Value&, const std::string&, Args&)) {
  return Value::function(
      name, [self, name, method](Args& a) { return method(self, name, a); }, false, &self);
}

Value list_method(const Value& self, const std::string& name, Args& a) {
  const auto x = a.take(0, "value");
  a.done(name, 1);
  if (!x) fail(fmt::format("{}() takes exactly one argument", name));
  const auto& items = self.list->items;
  if (name == "count") {
    return Value::integer(
        std::count_if(items.begin(), items.end(), [&](const Value& v) { return equals(v, *x); }));
  }
  for (size_t k = 0; k < items.size(); ++k) {
    if (equals(items[k], *x)) return Value::integer(static_cast<int64_t>(k));
  }
  fail(fmt::format("{} is not in list", repr(*x)));
}

Value dict_method(const Value& self, const std::string& name, Args& a) {
  const Dict& d = *self.dict;
  if (name == "get") {
    const auto key = a.take(0, "key");
    const auto def = a.take(1, "default");
    a.done(name, 2);
    if (!key) fail("get expected at least 1 argument, got 0");
    const Value* v = d.find(*key);
    return v ? *v : (def ? *def : Value::none());
  }
  a.done(name, 0);
  std::vector<Value> out;
  for (const auto& [k, v] : d.items) {
    if (name == "items") {
      out.push_back(Value::of_list({k, v}, true));
    } else {
      out.push_back(name == "keys" ? k : v);
    }
  }
  if (name == "copy") return self;
  return Value::of_view(std::move(out), "dict_" + name);
}

}  // namespace

Value get_attr(const Value& obj, std::string_view name) {
  const std::string n(name);
  switch (obj.kind) {
    case Kind::Str:
      if (is_str_method(n)) return bound(obj, n, str_method);
      break;
    case Kind::List:
      if (n == "index" || n == "count") return bound(obj, n, list_method);
      if (n == "append" || n == "pop" || n == "insert" || n == "remove" || n == "extend" ||
          n == "sort" || n == "reverse" || n == "clear") {
        return unsafe(type_name(obj), n);
      }
      break;
    case Kind::Dict:
      if (n == "get" || n == "items" || n == "keys" || n == "values" || n == "copy") {
        return bound(obj, n, dict_method);
      }
      if (n == "clear" || n == "pop" || n == "popitem" || n == "setdefault" || n == "update") {
        return unsafe("dict", n);
      }
      if (const Value* v = obj.dict->find(n)) return *v;
      break;
    case Kind::Namespace:
      if (const Value* v = obj.dict->find(n)) return *v;
      break;
    case Kind::Func:
      if (obj.func->macro && n == "name") return Value::string(obj.func->name);
      break;
    default:
      break;
  }
  return Value::undefined(fmt::format("{} object has no attribute '{}'", type_name(obj), n));
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_iter()) return Value::undefined("'generator' object is not subscriptable");
  if ((obj.is_list() || obj.is_string()) && key.is_number() && key.kind != Kind::Float) {
    int64_t k = as_int(key);
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.list->items.size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::undefined("list index out of range");
      return obj.list->items[static_cast<size_t>(k)];
    }
    const auto at = nth_code_point(obj.s.text, k);
    if (!at) return Value::undefined("string index out of range");
    return Value::string(obj.s.sub(at->first, at->second));
  }
  if (obj.kind == Kind::Dict) {
    if (const Value* v = obj.dict->find(key)) return *v;
  }
  if (key.is_string()) return get_attr(obj, key.s.text);
  return Value::undefined(fmt::format("{} object has no item {}", type_name(obj), repr(key)));
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step_v) {
  if (!obj.is_list() && !obj.is_string())
    fail(fmt::format("'{}' object is not subscriptable", type_name(obj)));
  auto idx = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    return want_int(v, "slice indices");
  };
  const int64_t step = idx(step_v).value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  std::vector<size_t> offs;
  int64_t n;
  if (obj.is_string() && step == 1) {
    // The common s[a:b]: two scans, no table of every code point's offset.
    n = static_cast<int64_t>(count_code_points(obj.s.text));
  } else if (obj.is_string()) {
    offs = code_point_offsets(obj.s.text);
    n = static_cast<int64_t>(offs.size()) - 1;
  } else {
    n = static_cast<int64_t>(obj.list->items.size());
  }
  auto norm = [&](std::optional<int64_t> v, int64_t def, int64_t lo, int64_t hi) {
    if (!v) return def;
    int64_t x = *v < 0 ? *v + n : *v;
    return std::clamp(x, lo, hi);
  };
  const int64_t b = step > 0 ? norm(idx(start), 0, 0, n) : norm(idx(start), n - 1, -1, n - 1);
  const int64_t e = step > 0 ? norm(idx(stop), n, 0, n) : norm(idx(stop), -1, -1, n - 1);
  if (obj.is_string() && step == 1) {
    auto byte_of = [&](int64_t k) {
      const auto at = k < n ? nth_code_point(obj.s.text, k) : std::nullopt;
      return at ? at->first : obj.s.text.size();
    };
    return Value::string(obj.s.sub(byte_of(b), byte_of(std::max(b, e))));
  }
  std::vector<int64_t> picks;
  // k += step stops before it would overflow ('abc'[1::2**63 - 1]).
  for (int64_t k = b; step > 0 ? k < e : k > e;) {
    picks.push_back(k);
    if (__builtin_add_overflow(k, step, &k)) break;
  }
  if (obj.is_string()) {
    Str out;
    for (int64_t k : picks) {
      out.append(obj.s.sub(offs[static_cast<size_t>(k)], offs[static_cast<size_t>(k + 1)]));
    }
    return Value::string(std::move(out));
  }
  std::vector<Value> items;
  for (int64_t k : picks) items.push_back(obj.list->items[static_cast<size_t>(k)]);
  return Value::of_list(std::move(items), obj.list->tuple);
}

Value call(const Value& fn, Args& args) {
  if (fn.kind == Kind::Func) return fn.func->call(args);
  if (fn.is_undefined()) {
    fail(undefined_message(fn));
  }
  fail(fmt::format("'{}' object is not callable", type_name(fn)));
}

std::string undefined_message(const Value& v) {
  if (v.b || v.name.find(' ') != std::string::npos) return v.name;  // a sentence already
  return fmt::format("'{}' is undefined", v.name.empty() ? "value" : v.name);
}

}  // namespace encore::jinja
