// Running a parsed template: scopes, statements and expressions with
// Jinja2's semantics (jinja.h). Scoping as Jinja2 compiles it: a `for` body
// is a new scope each iteration (a `set` inside it does not outlive the
// iteration: namespaces exist for that), `if` opens none, a macro runs in its
// own scope over the template's top level, `with` and call blocks open one.
#include <fmt/format.h>

#include <stdexcept>

#include "encore/error.h"
#include "jinja/ast.h"
#include "jinja/builtins.h"

namespace encore::jinja {

namespace {

struct Scope {
  Scope* parent = nullptr;
  std::unordered_map<std::string, Value> vars;

  const Value* find(const std::string& n) const {
    for (const Scope* s = this; s; s = s->parent) {
      const auto it = s->vars.find(n);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  Renderer(const RenderOptions& opt, Scope* root) : opt_(opt), root_(root) {}

  Str run(const Body& body) {
    Str out;
    out_ = &out;
    exec_body(body, *root_);
    return out;
  }

  int line() const { return line_; }

 private:
  void step(uint64_t n = 1) {
    steps_ += n;
    if (steps_ > opt_.limits.max_steps) {
      fail(fmt::format("the render took more than {} steps (max_steps)", opt_.limits.max_steps));
    }
  }

  // Work in proportion to a value's size: copying a string (every name
  // lookup does), scanning it (s[i] counts code points, s[::2] tables their
  // offsets at 8 bytes each), a filter going through a list. One step per 8
  // bytes or 16 items, so that a loop over a long string costs its length,
  // not one step per turn (which made `{% for i in range(n) %}{{ s[i] }}`
  // quadratic within max_steps).
  void charge(const Value& v) {
    if (v.kind == Kind::Str) {
      step(v.s.text.size() / 8);
    } else if (v.kind == Kind::List) {
      step(v.list->items.size() / 16);
    } else if (v.kind == Kind::Dict || v.kind == Kind::Namespace) {
      step(v.dict->items.size() / 16);
    }
  }

  struct Nest {
    explicit Nest(Renderer& r) : r_(r) {
      if (++r_.depth_ > r_.opt_.limits.max_call_depth) {
        fail(fmt::format("calls and statements nested deeper than {} (max_call_depth)",
                         r_.opt_.limits.max_call_depth));
      }
    }
    ~Nest() { --r_.depth_; }
    Renderer& r_;
  };

  // A string (or the output) would outgrow the output limit: no text over it
  // is ever needed, so none is built.
  [[noreturn]] void too_long() const {
    fail(fmt::format("the text would be over {} bytes (max_output_bytes)",
                     opt_.limits.max_output_bytes));
  }

  void emit(const Str& s) {
    if (out_->text.size() + s.text.size() > opt_.limits.max_output_bytes) too_long();
    out_->append(s);
  }

  // Renders `body` into a string of its own.
  // `flow`: how the body ended (a break or continue inside a set or filter
  // block leaves the loop iteration, as in jinja2).
  Str capture(const Body& body, Scope& scope, Flow* flow = nullptr) {
    Str buf;
    Str* saved = out_;
    out_ = &buf;
    try {
      const Flow f = exec_body(body, scope);
      if (flow) *flow = f;
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    return buf;
  }

  Flow exec_body(const Body& body, Scope& scope) {
    for (const auto& s : body) {
      const Flow f = exec(*s, scope);
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  void assign(Scope& scope, const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      scope.vars[targets[0]] = v;
      return;
    }
    if (!v.is_list() && !v.is_string() && !v.is_mapping()) {
      fail(fmt::format("cannot unpack non-iterable {} object", type_name(v)));
    }
    const std::vector<Value> items = iterate(v);
    if (items.size() != targets.size()) {
      fail(fmt::format("{} values to unpack (expected {})",
                       items.size() < targets.size() ? "not enough" : "too many", targets.size()));
    }
    for (size_t k = 0; k < targets.size(); ++k) scope.vars[targets[k]] = items[k];
  }

  Flow exec(const Stmt& s, Scope& scope) {
    line_ = s.line;
    step();
    switch (s.kind) {
      case StmtKind::Text:
        emit(Str(s.text));
        return Flow::Normal;
      case StmtKind::Print:
        emit(to_str(eval(*s.expr, scope)));
        return Flow::Normal;
      case StmtKind::If:
        for (const auto& [cond, body] : s.branches) {
          if (!cond || truthy(eval(*cond, scope))) {
            Nest nest(*this);
            return exec_body(body, scope);
          }
        }
        return Flow::Normal;
      case StmtKind::For:
        return exec_for(s, scope);
      case StmtKind::Set: {
        Value v = eval(*s.expr, scope);
        line_ = s.line;
        if (!s.attr.empty()) {
          const Value* ns = scope.find(s.targets[0]);
          if (!ns || ns->kind != Kind::Namespace) {
            fail("cannot assign attribute on non-namespace object");
          }
          ns->dict->set_in_namespace(Str(s.attr), std::move(v));
        } else {
          assign(scope, s.targets, v);
        }
        return Flow::Normal;
      }
      case StmtKind::SetBlock: {
        Nest nest(*this);
        Flow flow = Flow::Normal;
        Value v = Value::string(capture(s.body, scope, &flow));
        if (flow != Flow::Normal) return flow;  // the set never happens
        if (s.expr) v = filter_chain(*s.expr, std::move(v), scope);
        scope.vars[s.targets[0]] = std::move(v);
        return Flow::Normal;
      }
      case StmtKind::Macro: {
        // A macro defined inside a loop, with or a call block sees the
        // variables there (loop, the loop variable): jinja2's macros are
        // closures. They are copied, so the macro may outlive the scope.
        std::shared_ptr<Scope> closure;
        if (&scope != root_) {
          closure = std::make_shared<Scope>();
          closure->parent = root_;
          for (const Scope* at = &scope; at && at != root_; at = at->parent) {
            for (const auto& [k, v] : at->vars) closure->vars.emplace(k, v);
          }
        }
        scope.vars[s.name] = make_macro(s, nullptr, 0, closure);
        return Flow::Normal;
      }
      case StmtKind::CallBlock: {
        // The caller reads this block's scope: it may run only while the
        // block does (a caller kept in a namespace and called later fails).
        const uint64_t id = ++caller_ids_;
        live_callers_.push_back(id);
        const Value caller = make_macro(s, &scope, id);
        try {
          emit(to_str(eval_call(*s.expr, scope, &caller)));
        } catch (...) {
          live_callers_.pop_back();
          throw;
        }
        live_callers_.pop_back();
        return Flow::Normal;
      }
      case StmtKind::FilterBlock: {
        Nest nest(*this);
        Flow flow = Flow::Normal;
        Value v = Value::string(capture(s.body, scope, &flow));
        if (flow != Flow::Normal) return flow;  // nothing is written
        emit(to_str(filter_chain(*s.expr, std::move(v), scope)));
        return Flow::Normal;
      }
      case StmtKind::With: {
        Nest nest(*this);
        Scope inner;
        inner.parent = &scope;
        for (const auto& [n, e] : s.params) inner.vars[n] = eval(*e, scope);
        return exec_body(s.body, inner);
      }
      case StmtKind::Break:
        return Flow::Break;
      case StmtKind::Continue:
        return Flow::Continue;
      case StmtKind::Generation: {
        Nest nest(*this);
        return exec_body(s.body, scope);
      }
    }
    return Flow::Normal;
  }

  Flow exec_for(const Stmt& s, Scope& scope) {
    Nest nest(*this);
    std::vector<Value> items = iterate(eval(*s.expr, scope));
    if (s.cond) {
      std::vector<Value> kept;
      for (Value& v : items) {
        Scope probe;
        probe.parent = &scope;
        assign(probe, s.targets, v);
        if (truthy(eval(*s.cond, probe))) kept.push_back(std::move(v));
      }
      items = std::move(kept);
    }
    const auto n = static_cast<int64_t>(items.size());
    // loop.changed(*values)'s memory, shared by the iterations of this loop.
    auto last_changed = std::make_shared<std::optional<Value>>();
    bool completed = false;
    for (int64_t k = 0; k < n; ++k) {
      step();
      Scope inner;
      inner.parent = &scope;
      Dict loop;
      loop.set(Str("index"), Value::integer(k + 1));
      loop.set(Str("index0"), Value::integer(k));
      loop.set(Str("revindex"), Value::integer(n - k));
      loop.set(Str("revindex0"), Value::integer(n - k - 1));
      loop.set(Str("first"), Value::boolean(k == 0));
      loop.set(Str("last"), Value::boolean(k == n - 1));
      loop.set(Str("length"), Value::integer(n));
      // Only a recursive loop (refused) goes deeper: a nested loop is depth 1 too.
      loop.set(Str("depth"), Value::integer(1));
      loop.set(Str("depth0"), Value::integer(0));
      if (k > 0) loop.set(Str("previtem"), items[static_cast<size_t>(k - 1)]);
      if (k + 1 < n) loop.set(Str("nextitem"), items[static_cast<size_t>(k + 1)]);
      loop.set(Str("cycle"), Value::function("loop.cycle", [k](Args& a) {
                 if (a.pos.empty()) fail("no items for cycling given");
                 return a.pos[static_cast<size_t>(k) % a.pos.size()];
               }));
      loop.set(Str("changed"), Value::function("loop.changed", [last_changed](Args& a) {
                 Value now = Value::of_list(a.pos, true);
                 // Kept by the loop, which is a namespace: loop.changed(loop)
                 // would be a cycle.
                 if (nesting_of(now).has_namespace) {
                   fail("loop.changed() of a namespace (or of loop) is not supported");
                 }
                 if (*last_changed && equals(**last_changed, now)) return Value::boolean(false);
                 *last_changed = std::move(now);
                 return Value::boolean(true);
               }));
      inner.vars["loop"] = Value::of_namespace(std::move(loop));
      assign(inner, s.targets, items[static_cast<size_t>(k)]);
      const Flow f = exec_body(s.body, inner);
      if (f == Flow::Break) break;
      completed = completed || f == Flow::Normal;
    }
    // jinja2 clears its "no iteration" flag at the end of a body: the else
    // runs unless some iteration got there (a break or continue in every
    // iteration that ran leaves it set).
    if (!completed && !s.else_body.empty()) return exec_body(s.else_body, scope);
    return Flow::Normal;
  }

  // A macro (or a call block's caller) as a function value. Macros run over
  // the template's top-level scope; a caller over the scope of its block.
  Value make_macro(const Stmt& s, Scope* parent, uint64_t caller_id = 0,
                   std::shared_ptr<Scope> closure = nullptr) {
    Scope* base = closure ? closure.get() : parent ? parent : root_;
    const std::string name = s.kind == StmtKind::Macro ? s.name : "caller";
    // What the closure holds counts as held by the function (its depth, a
    // namespace in it: storing the macro in that namespace would be a cycle).
    Value held;
    if (closure) {
      std::vector<Value> vars;
      for (const auto& [k, v] : closure->vars) vars.push_back(v);
      held = Value::of_list(std::move(vars));
    }
    return Value::function(
        name,
        [this, &s, base, caller_id, closure](Args& a) -> Value {
          if (caller_id && std::find(live_callers_.begin(), live_callers_.end(), caller_id) ==
                               live_callers_.end()) {
            fail("caller() called after its {% call %} block ended");
          }
          Nest nest(*this);
          Scope local;
          local.parent = base;
          // The closure does not hold the macro itself (a cycle): a fresh
          // value of it, for recursion.
          if (closure) local.vars[s.name] = make_macro(s, nullptr, 0, closure);
          size_t k = 0;
          for (const auto& [pname, def] : s.params) {
            std::optional<Value> v = a.take(k++, pname);
            if (v) {
              local.vars[pname] = std::move(*v);
            } else if (def) {
              local.vars[pname] = eval(*def, local);
            } else {
              local.vars[pname] = Value::undefined(pname);
            }
          }
          // jinja2 takes extra arguments only into a macro that reads them.
          const std::string who =
              s.kind == StmtKind::Macro ? fmt::format("macro '{}'", s.name) : "caller";
          if (a.pos.size() > s.params.size() && !s.catch_varargs) {
            fail(fmt::format("{} takes not more than {} argument(s)", who, s.params.size()));
          }
          if (!a.kw.empty() && !s.catch_kwargs) {
            fail(fmt::format("{} takes no keyword argument '{}'", who, a.kw[0].first));
          }
          std::vector<Value> extra;
          for (size_t p = s.params.size(); p < a.pos.size(); ++p) extra.push_back(a.pos[p]);
          local.vars["varargs"] = Value::of_list(std::move(extra), true);
          Dict kw;
          for (auto& [kname, v] : a.kw) kw.set(Str(kname), std::move(v));
          local.vars["kwargs"] = Value::of_dict(std::move(kw));
          if (a.caller) local.vars["caller"] = *a.caller;
          const int saved_line = line_;
          Str out = capture(s.body, local);
          line_ = saved_line;
          return Value::string(std::move(out));
        },
        /*macro=*/true, closure ? &held : nullptr);
  }

  Value filter_chain(const Expr& e, Value input, Scope& scope) {
    // e is a Filter whose innermost `a` is null: apply from the inside out.
    if (e.kind != ExprKind::Filter) return input;
    if (e.a) input = filter_chain(*e.a, std::move(input), scope);
    Args args = eval_args(e, scope);
    line_ = e.line;
    return apply_filter(e.name, input, args);
  }

  Args eval_args(const Expr& e, Scope& scope) {
    Args args;
    for (const auto& x : e.args) args.pos.push_back(eval(*x, scope));
    for (const auto& [n, x] : e.kwargs) args.kw.emplace_back(n, eval(*x, scope));
    return args;
  }

  Value eval_call(const Expr& e, Scope& scope, const Value* caller) {
    Value fn = eval(*e.a, scope);
    Args args = eval_args(e, scope);
    if (caller) args.caller = *caller;
    line_ = e.line;
    return call(fn, args);
  }

  [[noreturn]] static void undefined_op(const Value& v) { fail(undefined_message(v)); }
  // Python's ints have no bound; a chat template's have 64 bits.
  [[noreturn]] static void int_overflow() {
    fail("integer overflow: integers beyond 64 bits are not supported");
  }

  Value binary(const std::string& op, const Value& l, const Value& r) {
    if (l.is_undefined()) undefined_op(l);
    if (r.is_undefined()) undefined_op(r);
    const bool ints =
        l.is_number() && r.is_number() && l.kind != Kind::Float && r.kind != Kind::Float;
    const bool nums = l.is_number() && r.is_number();
    auto overflow = [&](bool bad) {
      if (bad) int_overflow();
    };
    if (op == "+") {
      if (ints) {
        int64_t out;
        overflow(__builtin_add_overflow(as_int(l), as_int(r), &out));
        return Value::integer(out);
      }
      if (nums) return Value::number(as_double(l) + as_double(r));
      if (l.is_string() && r.is_string()) {
        if (l.s.text.size() + r.s.text.size() > opt_.limits.max_output_bytes) too_long();
        // Markup + str escapes the plain side (markupsafe), and stays Markup.
        const bool markup = l.is_markup() || r.is_markup();
        Str s = markup && !l.is_markup() ? apply_filter("escape", l, no_args_).s : l.s;
        s.append(markup && !r.is_markup() ? apply_filter("escape", r, no_args_).s : r.s);
        Value out = Value::string(std::move(s));
        out.b = markup;
        return out;
      }
      const auto plain = [](const Value& v) { return !v.list->iter && v.list->view.empty(); };
      if (l.is_list() && r.is_list() && plain(l) && plain(r)) {
        if (l.list->tuple != r.list->tuple) {
          fail(fmt::format("can only concatenate {0} (not \"{1}\") to {0}", type_name(l),
                           type_name(r)));
        }
        if (l.list->items.size() + r.list->items.size() > kMaxListItems) {
          fail(fmt::format("a list of more than {} items", kMaxListItems));
        }
        std::vector<Value> items = l.list->items;
        items.insert(items.end(), r.list->items.begin(), r.list->items.end());
        return Value::of_list(std::move(items), l.list->tuple);
      }
    } else if (op == "-") {
      if (ints) {
        int64_t out;
        overflow(__builtin_sub_overflow(as_int(l), as_int(r), &out));
        return Value::integer(out);
      }
      if (nums) return Value::number(as_double(l) - as_double(r));
    } else if (op == "*") {
      if (ints) {
        int64_t out;
        overflow(__builtin_mul_overflow(as_int(l), as_int(r), &out));
        return Value::integer(out);
      }
      if (nums) return Value::number(as_double(l) * as_double(r));
      const Value* seq = l.is_string() || l.is_list() ? &l : &r;
      const Value* times = seq == &l ? &r : &l;
      if ((seq->is_string() || seq->is_list()) && times->is_number() &&
          times->kind != Kind::Float) {
        const int64_t n = std::max<int64_t>(0, as_int(*times));
        const auto unit =
            static_cast<uint64_t>(seq->is_string() ? seq->s.text.size() : seq->list->items.size());
        // unit * n, without its overflow: 'abcd' * 2 ** 62 wraps to 0.
        const uint64_t limit = seq->is_string() ? opt_.limits.max_output_bytes : kMaxListItems;
        if (n > 0 && unit > limit / static_cast<uint64_t>(n)) {
          if (seq->is_string()) too_long();
          fail(fmt::format("a list of more than {} items", kMaxListItems));
        }
        if (seq->is_string()) {
          Str s;
          for (int64_t k = 0; k < n; ++k) s.append(seq->s);
          return Value::string(std::move(s));
        }
        // Items are copies (strings and all): [s] * n costs n strings.
        uint64_t bytes = 0;
        for (const Value& x : seq->list->items) bytes += sizeof(Value) + x.s.text.size();
        if (n > 0 && bytes > (uint64_t{4} * kMaxStringBytes) / static_cast<uint64_t>(n)) {
          fail(fmt::format("a list of more than {} MiB", (4 * kMaxStringBytes) >> 20));
        }
        std::vector<Value> items;
        for (int64_t k = 0; k < n; ++k) {
          items.insert(items.end(), seq->list->items.begin(), seq->list->items.end());
        }
        return Value::of_list(std::move(items));
      }
    } else if (op == "/") {
      if (nums) {
        if (as_double(r) == 0) fail("division by zero");
        return Value::number(as_double(l) / as_double(r));
      }
    } else if (op == "//" || op == "%") {
      if (ints) {
        const int64_t a = as_int(l), b = as_int(r);
        if (b == 0) fail("integer division or modulo by zero");
        if (a == INT64_MIN && b == -1) int_overflow();
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          q -= 1;
          m += b;
        }
        return Value::integer(op == "//" ? q : m);
      }
      if (nums) {
        const double a = as_double(l), b = as_double(r);
        if (b == 0) fail("float division by zero");
        const double q = std::floor(a / b);
        if (op == "//") return Value::number(q);
        double m = std::fmod(a, b);
        if (m != 0 && ((m < 0) != (b < 0))) m += b;
        return Value::number(m);
      }
      if (op == "%" && l.is_string()) fail("printf-style '%' string formatting is not supported");
    } else if (op == "**") {
      if (ints && as_int(r) >= 0) {
        // 0, 1 and -1 never overflow: answered directly, so the loop below
        // (which overflows within 63 rounds for any other base) stays short.
        const int64_t base = as_int(l), e = as_int(r);
        if (base == 0 || base == 1) return Value::integer(e == 0 ? 1 : base);
        if (base == -1) return Value::integer(e % 2 == 0 ? 1 : -1);
        int64_t out = 1;
        for (int64_t k = 0; k < e; ++k) overflow(__builtin_mul_overflow(out, base, &out));
        return Value::integer(out);
      }
      if (nums) {
        const double a = as_double(l), b = as_double(r);
        if (a == 0 && b < 0) fail("0.0 cannot be raised to a negative power");
        // Python gives a complex number: (-8) ** (1 / 3) is (1.0000000000000002+1.73...j).
        if (a < 0 && std::isfinite(b) && b != std::floor(b)) {
          fail("a negative number to a fractional power is complex: not supported");
        }
        return Value::number(std::pow(a, b));
      }
    }
    fail(fmt::format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(l),
                     type_name(r)));
  }

  bool contains(const Value& container, const Value& item) {
    switch (container.kind) {
      case Kind::Str:
        if (!item.is_string()) {
          fail(fmt::format("'in <string>' requires string as left operand, not {}",
                           type_name(item)));
        }
        return container.s.text.find(item.s.text) != std::string::npos;
      case Kind::List:
        for (const Value& v : container.list->items) {
          if (equals(v, item)) return true;
        }
        return false;
      case Kind::Dict:
        return container.dict->find(item) != nullptr;
      case Kind::Undefined:
        return false;
      default:
        fail(fmt::format("argument of type '{}' is not iterable", type_name(container)));
    }
  }

  bool compare(const std::string& op, const Value& l, const Value& r) {
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    if (op == "in") return contains(r, l);
    if (op == "not in") return !contains(r, l);
    if (l.is_undefined()) undefined_op(l);
    if (r.is_undefined()) undefined_op(r);
    if (op == "<") return less(l, r);
    if (op == ">") return less(r, l);
    if (op == "<=") return !less(r, l);
    return !less(l, r);  // ">="
  }

  Value eval(const Expr& e, Scope& scope) {
    Value v = eval_node(e, scope);
    charge(v);
    return v;
  }

  Value eval_node(const Expr& e, Scope& scope) {
    step();
    line_ = e.line;
    switch (e.kind) {
      case ExprKind::Literal:
        return e.literal;
      case ExprKind::Name: {
        const Value* v = scope.find(e.name);
        return v ? *v : Value::undefined(e.name);
      }
      case ExprKind::List:
      case ExprKind::Tuple: {
        std::vector<Value> items;
        for (const auto& x : e.items) items.push_back(eval(*x, scope));
        return Value::of_list(std::move(items), e.kind == ExprKind::Tuple);
      }
      case ExprKind::Dict: {
        Dict d;
        for (size_t k = 0; k + 1 < e.items.size(); k += 2) {
          Value key = eval(*e.items[k], scope);
          d.set(std::move(key), eval(*e.items[k + 1], scope));
        }
        return Value::of_dict(std::move(d));
      }
      case ExprKind::Attr: {
        Value obj = eval(*e.a, scope);
        line_ = e.line;
        if (obj.is_undefined()) undefined_op(obj);
        Value v = get_attr(obj, e.name);
        if (v.is_undefined() && v.name.empty()) v.name = e.name;
        return v;
      }
      case ExprKind::Item: {
        Value obj = eval(*e.a, scope);
        Value key = eval(*e.b, scope);
        line_ = e.line;
        if (obj.is_undefined()) undefined_op(obj);
        return get_item(obj, key);
      }
      case ExprKind::Slice: {
        Value obj = eval(*e.a, scope);
        Value b = e.b ? eval(*e.b, scope) : Value::none();
        Value c = e.c ? eval(*e.c, scope) : Value::none();
        Value d = e.d ? eval(*e.d, scope) : Value::none();
        line_ = e.line;
        if (obj.is_undefined()) undefined_op(obj);
        return slice(obj, b, c, d);
      }
      case ExprKind::Call:
        return eval_call(e, scope, nullptr);
      case ExprKind::Filter: {
        Value v = e.a ? eval(*e.a, scope) : Value::undefined();
        Args args = eval_args(e, scope);
        line_ = e.line;
        return apply_filter(e.name, v, args);
      }
      case ExprKind::Test: {
        Value v = eval(*e.a, scope);
        Args args = eval_args(e, scope);
        line_ = e.line;
        return Value::boolean(apply_test(e.name, v, args) != e.negated);
      }
      case ExprKind::Unary: {
        Value v = eval(*e.a, scope);
        if (e.name == "not") return Value::boolean(!truthy(v));
        if (v.is_undefined()) undefined_op(v);
        if (v.kind == Kind::Float) return Value::number(e.name == "-" ? -v.f : v.f);
        if (v.is_number()) {
          const int64_t i = as_int(v);
          if (e.name == "-" && i == INT64_MIN) int_overflow();
          return Value::integer(e.name == "-" ? -i : i);
        }
        fail(fmt::format("bad operand type for unary {}: '{}'", e.name, type_name(v)));
      }
      case ExprKind::Binary: {
        Value l = eval(*e.a, scope);
        if (e.name == "and") return truthy(l) ? eval(*e.b, scope) : l;
        if (e.name == "or") return truthy(l) ? l : eval(*e.b, scope);
        Value r = eval(*e.b, scope);
        line_ = e.line;
        return binary(e.name, l, r);
      }
      case ExprKind::Compare: {
        Value l = eval(*e.items[0], scope);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value r = eval(*e.items[k + 1], scope);
          line_ = e.line;
          if (!compare(e.ops[k], l, r)) return Value::boolean(false);
          l = std::move(r);
        }
        return Value::boolean(true);
      }
      case ExprKind::Concat: {
        Str s;
        for (const auto& x : e.items) {
          s.append(to_str(eval(*x, scope)));
          if (s.text.size() > opt_.limits.max_output_bytes) too_long();
        }
        return Value::string(std::move(s));
      }
      case ExprKind::Cond:
        if (truthy(eval(*e.a, scope))) return eval(*e.b, scope);
        return e.c ? eval(*e.c, scope) : Value::undefined();
    }
    return Value::undefined();
  }

  const RenderOptions& opt_;
  Scope* root_;
  Str* out_ = nullptr;
  Args no_args_;
  uint64_t steps_ = 0;
  uint64_t caller_ids_ = 0;
  std::vector<uint64_t> live_callers_;
  int depth_ = 0;
  int line_ = 0;
};

std::vector<ByteRange> complement(const std::vector<ByteRange>& content, size_t size) {
  std::vector<ByteRange> out;
  size_t at = 0;
  for (const ByteRange& r : content) {
    if (r.begin > at) out.push_back({at, r.begin});
    at = r.end;
  }
  if (at < size) out.push_back({at, size});
  return out;
}

}  // namespace

Template::Template(std::string_view source) {
  auto program = std::make_unique<detail::Program>();
  try {
    program->body = detail::parse_template(source);
  } catch (const RenderError& e) {
    throw InvalidArgument(fmt::format("chat template line {}: {}", e.line, e.message));
  } catch (const std::logic_error& e) {
    // A standard-library refusal (std::stoll's out_of_range ...) that a check
    // missed: still the template's fault, never the caller's crash.
    throw InvalidArgument(fmt::format("chat template: {}", e.what()));
  }
  program_ = std::move(program);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

Rendered Template::render(const nlohmann::ordered_json& context,
                          const RenderOptions& options) const {
  if (!context.is_object()) throw InvalidArgument("chat template context: must be a JSON object");
  Scope globals;
  Dict g = make_globals(options.now_unix_seconds);
  for (auto& [k, v] : g.items) globals.vars[k.s.text] = v;
  Scope root;
  root.parent = &globals;
  for (auto it = context.begin(); it != context.end(); ++it) {
    try {
      root.vars[it.key()] = from_json(it.value(), options.trusted_paths, "/" + it.key());
    } catch (const RenderError& e) {  // nested too deeply
      throw InvalidArgument(fmt::format("chat template context: '{}': {}", it.key(), e.message));
    }
  }
  Renderer r(options, &root);
  try {
    Str out = r.run(program_->body);
    Rendered result;
    result.template_ranges = complement(out.content, out.text.size());
    result.text = std::move(out.text);
    return result;
  } catch (const RenderError& e) {
    throw InvalidArgument(
        fmt::format("chat template line {}: {}", e.line ? e.line : r.line(), e.message));
  } catch (const std::logic_error& e) {  // as in the constructor
    throw InvalidArgument(fmt::format("chat template line {}: {}", r.line(), e.what()));
  }
}

}  // namespace encore::jinja
