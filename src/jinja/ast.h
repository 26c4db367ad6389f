// The parsed form of a Jinja template (parse.cpp builds it, render.cpp runs
// it). Every node keeps its template line for errors.
//
// Ownership: a Program owns its tree; nodes own their children.
// Thread-safety: immutable after parsing.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace encore::jinja {

enum class ExprKind {
  Literal,  // literal
  Name,     // name
  List,     // items
  Tuple,    // items
  Dict,     // items: key, value, key, value ...
  Attr,     // a.name
  Item,     // a[b]
  Slice,    // a[b:c:d] (b, c, d may be null)
  Call,     // a(args, kwargs)
  Filter,   // a | name(args, kwargs); a is null in {% filter %}
  Test,     // a is [not] name(args)
  Unary,    // name ("-", "+", "not") a
  Binary,   // a name b: + - * / // % ** and or
  Compare,  // items[0] ops[0] items[1] ops[1] items[2] ...
  Concat,   // items joined by ~
  Cond,     // b if a else c
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  ExprKind kind = ExprKind::Literal;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<ExprPtr> items;
  std::vector<std::string> ops;
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // Test: "is not"
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

enum class StmtKind {
  Text,         // text
  Print,        // {{ expr }}
  If,           // branches (conditions; a null condition is the else)
  For,          // targets in expr [if cond] body [else else_body]
  Set,          // targets = expr, or ns.attr = expr (attr non-empty)
  SetBlock,     // {% set targets[0] [| filter] %}body{% endset %}
  Macro,        // name(params) body
  CallBlock,    // {% call(params) expr %}body{% endcall %}
  FilterBlock,  // {% filter expr %}body{% endfilter %}: expr is a Filter chain over null
  With,         // {% with params %}body{% endwith %}
  Break,
  Continue,
  Generation,  // transformers' {% generation %}body{% endgeneration %}: renders body
};

struct Stmt {
  StmtKind kind = StmtKind::Text;
  int line = 0;
  std::string text;
  std::string name;
  std::string attr;
  std::vector<std::string> targets;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  // Macro and caller parameters, With assignments: name and default (or null).
  std::vector<std::pair<std::string, ExprPtr>> params;
  Body body;
  Body else_body;
  // Macro, CallBlock: whether the body reads `varargs` / `kwargs`; jinja2's
  // macros take extra positional / keyword arguments only then.
  bool catch_varargs = false;
  bool catch_kwargs = false;
};

}  // namespace encore::jinja

namespace encore::jinja::detail {

struct Program {
  Body body;
};

// Parses a template (parse.cpp). Throws RenderError with the line.
Body parse_template(std::string_view source);

// Whether a filter or test of this name exists (builtins.cpp); the parser
// refuses others, as Jinja2 does when it compiles the template.
bool known_filter(std::string_view name);
bool known_test(std::string_view name);

}  // namespace encore::jinja::detail
