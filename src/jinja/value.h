// The values a Jinja template computes with, and Python's rules for them:
// truthiness, ==, <, str(), repr(), len() and json.dumps, as python3-jinja2
// applies them (the oracle of tests/jinja/).
//
// Strings carry content marks (Str::content): the byte ranges that came from
// the render context rather than from the template's own text (jinja.h,
// "Special tokens"). Operations that keep bytes (concatenation, slicing,
// strip, split, join, replace) keep their marks, and what the template adds
// (a separator, a replacement) stays template text; operations that rewrite
// text (upper, title, tojson ...) mark the whole result as content when any
// input byte was content, so content never turns into template text.
//
// Ownership: values are plain copies except List, Dict and Func, shared
// through shared_ptr; lists and dicts are never modified after they are
// built, except a namespace() (Kind::Namespace), which `set ns.x` changes.
// Thread-safety: a render owns its values; nothing here is shared between
// renders.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "encore/jinja.h"

namespace encore::jinja {

// The longest string any operation builds (replace, join, indent ...; the
// renderer holds its own strings to RenderOptions::limits.max_output_bytes).
inline constexpr size_t kMaxStringBytes = size_t{64} << 20;
[[noreturn]] void too_long_string();

// A string and the byte ranges of it that are content.
struct Str {
  std::string text;
  std::vector<ByteRange> content;  // ascending, disjoint, non-adjacent

  Str() = default;
  explicit Str(std::string t) : text(std::move(t)) {}
  static Str marked(std::string t);  // all content (when non-empty)

  bool has_content() const { return !content.empty(); }
  void append(const Str& s);
  void append(std::string_view plain);
  // Bytes [b, e) with their marks.
  Str sub(size_t b, size_t e) const;
  // `t` marked as content entirely when this string has any content.
  Str derived(std::string t) const;
};

enum class Kind { Undefined, None, Bool, Int, Float, Str, List, Dict, Namespace, Func };

struct Value;
struct Args;

// The most items a list built by a template may hold (range(), [x] * n,
// list + list): a Value is ~200 bytes, so 1M items are ~200 MB already.
inline constexpr size_t kMaxListItems = 1'000'000;

// How deep lists, dicts, namespaces and bound methods may nest. Printing,
// comparing, serialising and freeing a value recurse through its levels, so
// a template that wraps a list in a list in a loop must be stopped before the
// stack is: the constructors below count the levels and fail past this.
inline constexpr int kMaxNesting = 256;

// The nesting a container records: levels below it (a leaf value is 0), and
// whether a namespace is somewhere inside (the one mutable object: what is
// set into it later is not in the count, see render.cpp's `set ns.x`).
struct Nesting {
  int depth = 0;
  bool has_namespace = false;
};

struct List {
  std::vector<Value> items;
  bool tuple = false;  // printed (a, b) by str()
  // A generator (what map, select, unique ... give in Jinja2): iterable, but
  // always true, without len(), not JSON-serializable and not printable.
  bool iter = false;
  // What Python would print instead of a list: a dict view ("dict_items",
  // printed dict_items([...])) or a range ("range(0, 3)", printed as is).
  // Neither is JSON-serializable.
  std::string view;
  Nesting nesting;  // of this list: 1 + its deepest item
};

// A dict: keys are strings, or numbers, booleans and None (Python's equal
// numbers are one key: 1, 1.0 and True).
struct Dict {
  std::vector<std::pair<Value, Value>> items;     // insertion order
  std::unordered_map<std::string, size_t> index;  // key_id -> position
  Nesting nesting{1, false};                      // grows as items are set, never shrinks

  const Value* find(std::string_view key) const;
  const Value* find(const Value& key) const;
  void set(Str key, Value v);    // replaces in place or appends
  void set(Value key, Value v);  // fails for an unhashable key (list, dict)
  // A namespace's `set ns.key = v` (or namespace(key=v)): what v holds is
  // measured as it stands now, through the namespaces in it, and refused
  // when it holds this namespace (a cycle: never freed, printed forever) or
  // nests too deep. This is what keeps every value's real depth within about
  // twice kMaxNesting, whatever namespaces are changed after they are put
  // in a list.
  void set_in_namespace(Str key, Value v);
};

using Builtin = std::function<Value(Args&)>;

struct Func {
  std::string name;
  Builtin call;
  bool macro = false;  // a {% macro %} (or caller): jinja2's Macro has `.name`
  Nesting nesting;     // of the value a bound method holds (l.count holds l)
};

struct Value {
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  Str s;
  std::shared_ptr<const List> list;
  std::shared_ptr<Dict> dict;  // Dict and Namespace
  std::shared_ptr<const Func> func;
  std::string name;  // Undefined: what was looked up, for errors

  static Value undefined(std::string what = {});
  static Value none();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(Str v);
  static Value string(std::string v) { return string(Str(std::move(v))); }
  static Value of_list(std::vector<Value> items, bool tuple = false);
  static Value of_iter(std::vector<Value> items);
  static Value of_view(std::vector<Value> items, std::string view);
  static Value of_dict(Dict d);
  static Value of_namespace(Dict d);
  // `holds`: the value the function keeps (a bound method's object).
  static Value function(std::string name, Builtin call, bool macro = false,
                        const Value* holds = nullptr);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::Str; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  bool is_list() const { return kind == Kind::List; }
  bool is_iter() const { return kind == Kind::List && list->iter; }
  // A string marked safe (markupsafe.Markup, from `| safe`): b is the mark.
  bool is_markup() const { return kind == Kind::Str && b; }
  bool is_mapping() const { return kind == Kind::Dict || kind == Kind::Namespace; }
};

// Call arguments: positional, then keyword (in call order).
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  std::optional<Value> caller;  // a {% call %} block's body, for the macro it calls

  // The argument at position `i` or named `name`, removed from kw; nullopt
  // when neither was given.
  std::optional<Value> take(size_t i, std::string_view name);
  // Throws (via fail) when a keyword argument was not taken or more than
  // `max_pos` positional arguments were given.
  void done(std::string_view fn, size_t max_pos) const;
};

// A render error at a template line (0: no line known yet).
struct RenderError {
  std::string message;
  int line = 0;
};
[[noreturn]] void fail(std::string message);

// The nesting `v` records (0 for a string or number; a namespace counts as
// holding a namespace). Fails when a container of `v` would be too deep.
Nesting nesting_of(const Value& v);
Nesting nesting_around(const std::vector<Value>& items);  // of a container of these
// `outer` with `inner` one level below it; fails past kMaxNesting.
Nesting nesting_add(Nesting outer, Nesting inner);

// Python's type name of `v` ("str", "int", "list", "dict", "NoneType" ...).
std::string_view type_name(const Value& v);

// The number of a Bool or Int (as_int) and of any number (as_double), as
// Python's arithmetic reads them (True is 1).
int64_t as_int(const Value& v);
double as_double(const Value& v);

bool truthy(const Value& v);
bool equals(const Value& a, const Value& b);
// a < b as Python orders numbers, strings (by code point) and lists; fails
// for other pairs (TypeError in Python).
bool less(const Value& a, const Value& b);

// str(v), and repr(v), as Python writes them; Undefined prints as "".
Str to_str(const Value& v);
std::string repr(const Value& v);
// Python's repr of a float ("1.0", "0.1", "1e+16", "inf").
std::string float_repr(double d);

// len(v): code points of a string, items of a list or dict; fails otherwise.
int64_t length(const Value& v);

// Code point helpers over UTF-8 (invalid bytes count as one code point each).
size_t count_code_points(std::string_view s);
std::vector<size_t> code_point_offsets(std::string_view s);  // starts, plus s.size()
// The code point of the UTF-8 sequence s[b, e) (the byte itself if invalid).
uint32_t decode_cp(std::string_view s, size_t b, size_t e);
// The bytes [begin, end) of code point k (negative: from the end), without
// the offsets of all the others; nullopt when out of range.
std::optional<std::pair<size_t, size_t>> nth_code_point(std::string_view s, int64_t k);

// The items a `for` iterates: a list's items, a dict's keys, a string's
// characters; Undefined iterates nothing. Fails for other values.
std::vector<Value> iterate(const Value& v);

struct JsonFormat {
  std::optional<std::string> indent;  // nullopt: one line
  std::optional<std::pair<std::string, std::string>> separators;
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(v, ...) as Python writes it. Fails for Undefined and functions.
Str to_json(const Value& v, const JsonFormat& fmt);

// A context value from JSON; its strings are marked as content except under
// one of `trusted` (jinja.h RenderOptions::trusted_paths); `path` is j's own
// and `level` its depth (refused past kMaxNesting).
Value from_json(const nlohmann::ordered_json& j, const std::vector<std::string>& trusted,
                const std::string& path = "", int level = 0);

}  // namespace encore::jinja
