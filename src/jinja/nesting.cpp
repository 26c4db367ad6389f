// How deep values nest, and the one way to nest them without bound that is
// left after construction: setting a namespace's attribute (value.h,
// kMaxNesting and Dict::set_in_namespace say why it matters).
#include <fmt/format.h>

#include <algorithm>
#include <unordered_map>

#include "jinja/value.h"

namespace encore::jinja {

Nesting nesting_of(const Value& v) {
  switch (v.kind) {
    case Kind::List:
      return v.list->nesting;
    case Kind::Dict:
      return v.dict->nesting;
    case Kind::Namespace:
      return {v.dict->nesting.depth, true};
    case Kind::Func:
      return v.func->nesting;
    default:
      return {};
  }
}

Nesting nesting_add(Nesting outer, Nesting inner) {
  if (inner.depth + 1 > kMaxNesting) {
    fail(fmt::format("lists, dicts and namespaces nested deeper than {}", kMaxNesting));
  }
  return {std::max(outer.depth, inner.depth + 1), outer.has_namespace || inner.has_namespace};
}

Nesting nesting_around(const std::vector<Value>& items) {
  Nesting n{1, false};
  for (const Value& v : items) {
    if (v.kind >= Kind::List) n = nesting_add(n, nesting_of(v));
  }
  return n;
}

namespace {
// The levels below `v` as it stands (namespaces' current contents included).
int real_depth(const Value& v, const Dict* self, std::unordered_map<const void*, int>& memo,
               int level) {
  const Nesting n = nesting_of(v);
  if (!n.has_namespace) return n.depth;  // nothing mutable inside: the record is exact
  if (level > 2 * kMaxNesting + 2) {
    fail(fmt::format("lists, dicts and namespaces nested deeper than {}", kMaxNesting));
  }
  if (v.kind == Kind::Func)
    fail(
        "a function holding a namespace (a bound method, a macro defined in a loop) kept in a "
        "namespace is not supported");
  if (v.kind == Kind::Namespace && v.dict.get() == self)
    fail("a namespace holding itself is not supported");
  const void* key = v.kind == Kind::List ? static_cast<const void*>(v.list.get()) : v.dict.get();
  if (const auto it = memo.find(key); it != memo.end()) return it->second;
  int depth = 1;
  if (v.kind == Kind::List) {
    for (const Value& x : v.list->items) {
      depth = std::max(depth, 1 + real_depth(x, self, memo, level + 1));
    }
  } else {
    for (const auto& [k, x] : v.dict->items) {
      depth = std::max(depth, 1 + real_depth(x, self, memo, level + 1));
    }
  }
  memo.emplace(key, depth);
  return depth;
}
}  // namespace

void Dict::set_in_namespace(Str key, Value v) {
  int depth = nesting_of(v).depth;
  if (nesting_of(v).has_namespace) {
    std::unordered_map<const void*, int> memo;
    depth = real_depth(v, this, memo, 0);
  }
  if (depth + 1 > kMaxNesting) {
    fail(fmt::format("lists, dicts and namespaces nested deeper than {}", kMaxNesting));
  }
  set(std::move(key), std::move(v));
  nesting.depth = std::max(nesting.depth, depth + 1);
}

}  // namespace encore::jinja
