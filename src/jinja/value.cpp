#include "jinja/value.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

namespace encore::jinja {

namespace {

void add_range(std::vector<ByteRange>& ranges, size_t b, size_t e) {
  if (b >= e) return;
  if (!ranges.empty() && ranges.back().end >= b) {
    ranges.back().end = std::max(ranges.back().end, e);
    return;
  }
  ranges.push_back({b, e});
}

// One UTF-8 sequence's length at s[i] (1 for an invalid byte).
size_t utf8_len(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

// Python's str.isprintable for a non-ASCII code point, approximated by the
// separator, format and private-use blocks that real text meets.
bool printable(uint32_t cp) {
  if (cp < 0xA1) return cp >= 0x20 && cp < 0x7F;
  if (cp == 0xAD || (cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F)) return false;
  if ((cp >= 0x205F && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF) return false;
  if ((cp >= 0xD800 && cp <= 0xF8FF) || (cp >= 0xFFF0 && cp <= 0xFFFF)) return false;
  return cp < 0xF0000;
}

std::string str_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_len(s, i);
    const uint32_t cp = decode_cp(s, i, i + n);
    if (cp == static_cast<unsigned char>(quote) || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (printable(cp)) {
      out.append(s.substr(i, n));
    } else if (cp < 0x100) {
      out += fmt::format("\\x{:02x}", cp);
    } else if (cp < 0x10000) {
      out += fmt::format("\\u{:04x}", cp);
    } else {
      out += fmt::format("\\U{:08x}", cp);
    }
    i += n;
  }
  out += quote;
  return out;
}

void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_len(s, i);
    const uint32_t cp = decode_cp(s, i, i + n);
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
          if (cp >= 0x10000) {
            const uint32_t v = cp - 0x10000;
            out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            out += fmt::format("\\u{:04x}", cp);
          }
        } else {
          out.append(s.substr(i, n));
        }
    }
    i += n;
  }
  out += '"';
}

void json_value(std::string& out, const Value& v, const JsonFormat& f, int level, bool& content) {
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += *f.indent;
  };
  const std::string item_sep =
      f.separators ? f.separators->first : (f.indent ? std::string(",") : std::string(", "));
  const std::string key_sep = f.separators ? f.separators->second : std::string(": ");
  switch (v.kind) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.b ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.i);
      return;
    case Kind::Float:
      if (std::isnan(v.f)) {
        out += "NaN";
      } else if (std::isinf(v.f)) {
        out += v.f > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(v.f);
      }
      return;
    case Kind::Str:
      content = content || v.s.has_content();
      json_string(out, v.s.text, f.ensure_ascii);
      return;
    case Kind::List: {
      if (v.list->iter || !v.list->view.empty()) {
        fail(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
      }
      if (v.list->items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const Value& item : v.list->items) {
        if (!first) out += item_sep;
        first = false;
        if (f.indent) newline(level + 1);
        json_value(out, item, f, level + 1, content);
      }
      if (f.indent) newline(level);
      out += ']';
      return;
    }
    case Kind::Dict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (f.sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return less(a->first, b->first); });
      }
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += item_sep;
        first = false;
        if (f.indent) newline(level + 1);
        // json.dumps writes non-string keys as JSON scalars in quotes.
        const Value& k = kv->first;
        content = content || (k.is_string() && k.s.has_content());
        std::string key_text;
        if (k.is_string()) {
          key_text = k.s.text;
        } else if (k.is_list()) {
          fail("keys must be str, int, float, bool or None, not tuple");
        } else {
          json_value(key_text, k, f, 0, content);
        }
        json_string(out, key_text, f.ensure_ascii);
        out += key_sep;
        json_value(out, kv->second, f, level + 1, content);
      }
      if (f.indent) newline(level);
      out += '}';
      return;
    }
    default:
      fail(fmt::format("Object of type {} is not JSON serializable", type_name(v)));
  }
}

bool any_content(const Value& v) {
  switch (v.kind) {
    case Kind::Str:
      return v.s.has_content();
    case Kind::List:
      return std::any_of(v.list->items.begin(), v.list->items.end(), any_content);
    case Kind::Dict:
    case Kind::Namespace:
      return std::any_of(v.dict->items.begin(), v.dict->items.end(), [](const auto& kv) {
        return any_content(kv.first) || any_content(kv.second);
      });
    default:
      return false;
  }
}

}  // namespace

Str Str::marked(std::string t) {
  Str s(std::move(t));
  if (!s.text.empty()) s.content.push_back({0, s.text.size()});
  return s;
}

void too_long_string() {
  fail(fmt::format("a string of more than {} MiB (no chat template builds one)",
                   kMaxStringBytes >> 20));
}

void Str::append(const Str& s) {
  const size_t off = text.size();
  if (off + s.text.size() > kMaxStringBytes) too_long_string();
  text += s.text;
  for (const ByteRange& r : s.content) add_range(content, r.begin + off, r.end + off);
}

void Str::append(std::string_view plain) {
  if (text.size() + plain.size() > kMaxStringBytes) too_long_string();
  text.append(plain);
}

Str Str::sub(size_t b, size_t e) const {
  e = std::min(e, text.size());
  b = std::min(b, e);
  Str out(text.substr(b, e - b));
  // The ranges that end after b, by bisection: taking each character of a
  // string with many ranges must not cost all of them each time.
  auto it = std::upper_bound(content.begin(), content.end(), b,
                             [](size_t at, const ByteRange& r) { return at < r.end; });
  for (; it != content.end() && it->begin < e; ++it) {
    const size_t rb = std::max(it->begin, b), re = std::min(it->end, e);
    if (rb < re) add_range(out.content, rb - b, re - b);
  }
  return out;
}

Str Str::derived(std::string t) const {
  return has_content() ? Str::marked(std::move(t)) : Str(std::move(t));
}

namespace {
// The index key of a dict key; nullopt for an unhashable one.
std::optional<std::string> key_id(const Value& k) {
  switch (k.kind) {
    case Kind::Str:
      return "s" + k.s.text;
    case Kind::Bool:
      return std::string(k.b ? "i1" : "i0");
    case Kind::Int:
      return "i" + std::to_string(k.i);
    case Kind::Float:
      if (std::isfinite(k.f) && k.f == std::trunc(k.f) && std::fabs(k.f) < 9e18) {
        return "i" + std::to_string(static_cast<int64_t>(k.f));
      }
      return "f" + float_repr(k.f);
    case Kind::None:
      return std::string("n");
    case Kind::List: {
      // A tuple of hashable items is hashable: each item's id, length-prefixed.
      if (!k.list->tuple || k.list->iter || !k.list->view.empty()) return std::nullopt;
      std::string id = "t";
      for (const Value& x : k.list->items) {
        const auto sub = key_id(x);
        if (!sub) return std::nullopt;
        id += std::to_string(sub->size()) + ":" + *sub;
      }
      return id;
    }
    default:
      return std::nullopt;
  }
}
}  // namespace

const Value* Dict::find(std::string_view key) const {
  const auto it = index.find("s" + std::string(key));
  return it == index.end() ? nullptr : &items[it->second].second;
}

const Value* Dict::find(const Value& key) const {
  const auto id = key_id(key);
  if (!id) return nullptr;
  const auto it = index.find(*id);
  return it == index.end() ? nullptr : &items[it->second].second;
}

void Dict::set(Str key, Value v) { set(Value::string(std::move(key)), std::move(v)); }

void Dict::set(Value key, Value v) {
  const auto id = key_id(key);
  if (!id) fail(fmt::format("unhashable type: '{}'", type_name(key)));
  if (v.kind >= Kind::List) nesting = nesting_add(nesting, nesting_of(v));
  const auto it = index.find(*id);
  if (it != index.end()) {
    items[it->second].second = std::move(v);
    return;
  }
  index.emplace(*id, items.size());
  items.emplace_back(std::move(key), std::move(v));
}

Value Value::undefined(std::string what) {
  Value v;
  v.name = std::move(what);
  return v;
}
Value Value::none() {
  Value v;
  v.kind = Kind::None;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.kind = Kind::Bool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.kind = Kind::Int;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.kind = Kind::Float;
  v.f = x;
  return v;
}
Value Value::string(Str x) {
  Value v;
  v.kind = Kind::Str;
  v.s = std::move(x);
  return v;
}
Value Value::of_list(std::vector<Value> items, bool tuple) {
  Value v;
  v.kind = Kind::List;
  const Nesting n = nesting_around(items);
  v.list = std::make_shared<const List>(List{std::move(items), tuple, false, {}, n});
  return v;
}
Value Value::of_iter(std::vector<Value> items) {
  Value v;
  v.kind = Kind::List;
  const Nesting n = nesting_around(items);
  v.list = std::make_shared<const List>(List{std::move(items), false, true, {}, n});
  return v;
}
Value Value::of_view(std::vector<Value> items, std::string view) {
  Value v;
  v.kind = Kind::List;
  const Nesting n = nesting_around(items);
  v.list = std::make_shared<const List>(List{std::move(items), false, false, std::move(view), n});
  return v;
}
Value Value::of_dict(Dict d) {
  Value v;
  v.kind = Kind::Dict;
  v.dict = std::make_shared<Dict>(std::move(d));
  return v;
}
Value Value::of_namespace(Dict d) {
  Value v = of_dict(std::move(d));
  v.kind = Kind::Namespace;
  return v;
}
Value Value::function(std::string name, Builtin call, bool macro, const Value* holds) {
  Value v;
  v.kind = Kind::Func;
  const Nesting n =
      holds && holds->kind >= Kind::List ? nesting_add({}, nesting_of(*holds)) : Nesting{};
  v.func = std::make_shared<const Func>(Func{std::move(name), std::move(call), macro, n});
  return v;
}

std::optional<Value> Args::take(size_t i, std::string_view name) {
  if (i < pos.size()) return pos[i];
  for (auto it = kw.begin(); it != kw.end(); ++it) {
    if (it->first == name) {
      Value v = std::move(it->second);
      kw.erase(it);
      return v;
    }
  }
  return std::nullopt;
}

void Args::done(std::string_view fn, size_t max_pos) const {
  if (!kw.empty())
    fail(fmt::format("{}() got an unexpected keyword argument '{}'", fn, kw[0].first));
  if (pos.size() > max_pos) {
    fail(fmt::format("{}() takes at most {} arguments ({} given)", fn, max_pos, pos.size()));
  }
}

void fail(std::string message) { throw RenderError{std::move(message), 0}; }

std::string_view type_name(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::Str:
      return "str";
    case Kind::List:
      if (v.list->view.rfind("range(", 0) == 0) return "range";
      if (!v.list->view.empty()) return v.list->view;
      return v.list->iter ? "generator" : v.list->tuple ? "tuple" : "list";
    case Kind::Dict:
      return "dict";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Func:
      return "function";
  }
  return "object";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return v.b;
    case Kind::Int:
      return v.i != 0;
    case Kind::Float:
      return v.f != 0;
    case Kind::Str:
      return !v.s.text.empty();
    case Kind::List:
      return v.list->iter || !v.list->items.empty();
    case Kind::Dict:
      return !v.dict->items.empty();
    default:
      return true;
  }
}

int64_t as_int(const Value& v) { return v.kind == Kind::Bool ? int64_t{v.b} : v.i; }

double as_double(const Value& v) {
  return v.kind == Kind::Float ? v.f : static_cast<double>(as_int(v));
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float) {
      return as_int(a) == as_int(b);
    }
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::Str:
      return a.s.text == b.s.text;
    case Kind::List: {
      if (a.list->iter || b.list->iter) return a.list == b.list;
      if (a.list->tuple != b.list->tuple || a.list->view != b.list->view ||
          a.list->items.size() != b.list->items.size()) {
        return false;
      }
      for (size_t k = 0; k < a.list->items.size(); ++k) {
        if (!equals(a.list->items[k], b.list->items[k])) return false;
      }
      return true;
    }
    case Kind::Dict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equals(v, *o)) return false;
      }
      return true;
    }
    case Kind::Namespace:
      return a.dict == b.dict;
    case Kind::Func:
      return a.func == b.func;
    default:
      return false;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Kind::Float && b.kind != Kind::Float) {
      return as_int(a) < as_int(b);
    }
    return as_double(a) < as_double(b);
  }
  if (a.is_string() && b.is_string()) return a.s.text < b.s.text;  // UTF-8 order = code points
  if (a.is_list() && b.is_list()) {
    const auto& x = a.list->items;
    const auto& y = b.list->items;
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (!equals(x[k], y[k])) return less(x[k], y[k]);
    }
    return x.size() < y.size();
  }
  fail(fmt::format("'<' not supported between instances of '{}' and '{}'", type_name(a),
                   type_name(b)));
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t epos = sci.find('e');
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string digits = sci.substr(0, epos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  if (exp >= -5 + 1 && exp < 16) {
    std::string out;
    if (exp >= 0) {
      const size_t int_len = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_len) {
        out = digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  return sign + out + fmt::format("e{}{:02d}", exp < 0 ? '-' : '+', std::abs(exp));
}

Str to_str(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return Str();
    case Kind::None:
      return Str("None");
    case Kind::Bool:
      return Str(v.b ? "True" : "False");
    case Kind::Int:
      return Str(std::to_string(v.i));
    case Kind::Float:
      return Str(float_repr(v.f));
    case Kind::Str:
      return v.s;
    case Kind::Func:
      return Str(fmt::format("<function {}>", v.func->name));
    default: {
      std::string text = repr(v);
      return any_content(v) ? Str::marked(std::move(text)) : Str(std::move(text));
    }
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::Str:
      return str_repr(v.s.text);
    case Kind::List: {
      if (v.list->iter)
        fail("printing a generator (the result of map, select ...) is not supported: add | list");
      if (v.list->view.rfind("range(", 0) == 0) return v.list->view;
      const auto& items = v.list->items;
      std::string out = v.list->view.empty() ? "" : v.list->view + "(";
      out += v.list->tuple ? '(' : '[';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += ", ";
        out += repr(items[k]);
      }
      if (v.list->tuple && items.size() == 1) out += ',';
      out += v.list->tuple ? ')' : ']';
      if (!v.list->view.empty()) out += ')';
      return out;
    }
    case Kind::Dict:
    case Kind::Namespace: {
      std::string out = v.kind == Kind::Namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, val] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += repr(k) + ": " + repr(val);
      }
      out += v.kind == Kind::Namespace ? "}>" : "}";
      return out;
    }
    default:
      return to_str(v).text;
  }
}

uint32_t decode_cp(std::string_view s, size_t b, size_t e) {
  const auto c = static_cast<unsigned char>(s[b]);
  if (e - b == 1) return c;
  uint32_t cp = c & (0xFFu >> (e - b + 1));
  for (size_t k = b + 1; k < e; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[k]) & 0x3Fu);
  return cp;
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += utf8_len(s, i)) ++n;
  return n;
}

std::optional<std::pair<size_t, size_t>> nth_code_point(std::string_view s, int64_t k) {
  if (k < 0) k += static_cast<int64_t>(count_code_points(s));
  if (k < 0) return std::nullopt;
  size_t i = 0;
  for (; i < s.size() && k > 0; --k) i += utf8_len(s, i);
  if (i >= s.size()) return std::nullopt;
  return std::make_pair(i, i + utf8_len(s, i));
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> out;
  for (size_t i = 0; i < s.size(); i += utf8_len(s, i)) out.push_back(i);
  out.push_back(s.size());
  return out;
}

int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return 0;
    case Kind::Str:
      return static_cast<int64_t>(count_code_points(v.s.text));
    case Kind::List:
      if (v.list->iter) fail("object of type 'generator' has no len()");
      return static_cast<int64_t>(v.list->items.size());
    case Kind::Dict:
      return static_cast<int64_t>(v.dict->items.size());
    default:
      fail(fmt::format("object of type '{}' has no len()", type_name(v)));
  }
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind) {
    case Kind::Undefined:
      return {};
    case Kind::List:
      return v.list->items;
    case Kind::Dict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Kind::Str: {
      const auto offs = code_point_offsets(v.s.text);
      std::vector<Value> chars;
      for (size_t k = 0; k + 1 < offs.size(); ++k) {
        chars.push_back(Value::string(v.s.sub(offs[k], offs[k + 1])));
      }
      return chars;
    }
    default:
      fail(fmt::format("'{}' object is not iterable", type_name(v)));
  }
}

Str to_json(const Value& v, const JsonFormat& fmt) {
  std::string out;
  bool content = false;
  json_value(out, v, fmt, 0, content);
  return content ? Str::marked(std::move(out)) : Str(std::move(out));
}

namespace {
// Whether `path` ("/messages/0/role") lies at or under `pattern`
// ("/messages/*/role").
bool under(std::string_view path, std::string_view pattern) {
  while (!pattern.empty()) {
    if (path.empty() || path[0] != '/' || pattern[0] != '/') return false;
    path.remove_prefix(1);
    pattern.remove_prefix(1);
    const size_t a = std::min(path.find('/'), path.size());
    const size_t b = std::min(pattern.find('/'), pattern.size());
    if (pattern.substr(0, b) != "*" && pattern.substr(0, b) != path.substr(0, a)) return false;
    path.remove_prefix(a);
    pattern.remove_prefix(b);
  }
  return true;
}
}  // namespace

Value from_json(const nlohmann::ordered_json& j, const std::vector<std::string>& trusted,
                const std::string& path, int level) {
  const bool content = std::none_of(trusted.begin(), trusted.end(),
                                    [&](const std::string& p) { return under(path, p); });
  using T = nlohmann::ordered_json::value_t;
  // Refused on the way down: the recursion itself must not outrun the stack.
  if (level >= kMaxNesting && (j.is_array() || j.is_object())) {
    fail(fmt::format("lists, dicts and namespaces nested deeper than {}", kMaxNesting));
  }
  switch (j.type()) {
    case T::null:
      return Value::none();
    case T::boolean:
      return Value::boolean(j.get<bool>());
    case T::number_integer:
      return Value::integer(j.get<int64_t>());
    case T::number_unsigned: {
      const auto u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case T::number_float:
      return Value::number(j.get<double>());
    case T::string: {
      std::string s = j.get<std::string>();
      return Value::string(content ? Str::marked(std::move(s)) : Str(std::move(s)));
    }
    case T::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        items.push_back(
            from_json(e, trusted, path + "/" + std::to_string(items.size()), level + 1));
      }
      return Value::of_list(std::move(items));
    }
    case T::object: {
      Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) {
        d.set(content ? Str::marked(it.key()) : Str(it.key()),
              from_json(it.value(), trusted, path + "/" + it.key(), level + 1));
      }
      return Value::of_dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

}  // namespace encore::jinja
