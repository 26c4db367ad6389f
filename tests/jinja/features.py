#!/usr/bin/env python3
"""Inventory of the Jinja features a set of chat templates uses, as Markdown.

Parses each template with jinja2's own lexer and parser (the environment the
oracle uses: trim_blocks, lstrip_blocks, loopcontrols) and walks the AST, so
the counts are exact: statements, filters, tests, method calls, loop.*
attributes, operators, literals, whitespace control, free variables.

    python3 tests/jinja/features.py [--templates DIR] > tests/jinja/FEATURES.md
"""
import argparse
import collections
import os
import sys

import jinja2
import jinja2.ext
import jinja2.meta
from jinja2 import nodes

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oracle  # noqa: E402


class Inventory:
    def __init__(self):
        # feature -> {template: count}
        self.uses = collections.defaultdict(collections.Counter)
        # feature -> (template, line number, source line) of the first use
        self.example = {}

    def add(self, section, feature, template, source_lines, lineno):
        feature = (section, feature)
        self.uses[feature][template] += 1
        if feature not in self.example and lineno:
            line = source_lines[lineno - 1].strip() if 0 < lineno <= len(source_lines) else ""
            if len(line) > 110:
                line = line[:107] + "..."
            self.example[feature] = (template, lineno, line)


BINOPS = {
    nodes.Add: "`+`", nodes.Sub: "`-`", nodes.Mul: "`*`", nodes.Div: "`/`",
    nodes.FloorDiv: "`//`", nodes.Mod: "`%`", nodes.Pow: "`**`",
    nodes.And: "`and`", nodes.Or: "`or`",
}
UNOPS = {nodes.Not: "`not`", nodes.Neg: "unary `-`", nodes.Pos: "unary `+`"}
CMPOPS = {"eq": "`==`", "ne": "`!=`", "lt": "`<`", "lteq": "`<=`", "gt": "`>`",
          "gteq": "`>=`", "in": "`in`", "notin": "`not in`"}


def walk_template(inv, name, source, env):
    lines = source.split("\n")

    def add(section, feature, node=None, lineno=None):
        ln = lineno if lineno is not None else getattr(node, "lineno", None)
        inv.add(section, feature, name, lines, ln)

    # Lexical level: delimiters with whitespace control, comments, literals.
    prev = None
    for lineno, tok, value in env.lex(source):
        if tok in ("block_begin", "block_end", "variable_begin", "variable_end",
                   "comment_begin", "comment_end"):
            add("Delimiters and whitespace control", f"`{value.strip()}`", lineno=lineno)
        if tok == "string":
            if prev == "string":
                add("Literals", "adjacent string literals (implicit concatenation)",
                    lineno=lineno)
            if "\\" in value:
                add("Literals", "string literal with backslash escape", lineno=lineno)
            if value.startswith("'"):
                add("Literals", "single-quoted string literal", lineno=lineno)
            else:
                add("Literals", "double-quoted string literal", lineno=lineno)
        if tok == "data" and "\n" in value:
            pass
        if tok not in ("whitespace",):
            prev = tok
    if any(ord(c) > 127 for c in source):
        ln = next(i + 1 for i, l in enumerate(lines) if any(ord(c) > 127 for c in l))
        add("Literals", "non-ASCII characters in the template source", lineno=ln)
    if source.endswith("\n"):
        add("Delimiters and whitespace control", "template source ends with a newline",
            lineno=len(lines) - 1)

    ast = env.parse(source)
    # Names the template reads but never assigns anywhere (find_undeclared_variables
    # also lists names assigned in one branch and read in another). It compiles the
    # AST (and folds constants in place), so it gets a parse of its own.
    # A name counts when the first thing the template does with it (in evaluation order:
    # the value of a set before its target) is to read it, as `set messages = messages or []`.
    first = {}

    def order(node):
        kids = list(node.iter_child_nodes())
        if isinstance(node, nodes.Assign):
            kids = [node.node, node.target]
        if isinstance(node, nodes.Name):
            first.setdefault(node.name, node.ctx)
        for k in kids:
            order(k)
    order(ast)
    for m in ast.find_all(nodes.Macro):
        first.setdefault(m.name, "store")
    undeclared = jinja2.meta.find_undeclared_variables(env.parse(source))
    for v in sorted(x for x in undeclared if first.get(x) == "load"):
        add("Free variables (read from the context or globals)", f"`{v}`", lineno=0)
    macros = {m.name for m in ast.find_all(nodes.Macro)}

    def visit(node, parent=None):
        t = type(node)
        S = "Statements"
        if t is nodes.For:
            add(S, "`for`", node)
            if isinstance(node.target, nodes.Tuple):
                add(S, "`for a, b in ...` (tuple unpacking)", node)
            if node.test is not None:
                add(S, "`for x in y if cond` (loop filter)", node)
            if node.else_:
                add(S, "`for ... else`", node)
            if node.recursive:
                add(S, "`for ... recursive`", node)
        elif t is nodes.If:
            if not (isinstance(parent, nodes.If) and node in parent.elif_):
                add(S, "`if`", node)
                if node.else_:
                    add(S, "`else` (of if)", node)
            for e in node.elif_:
                add(S, "`elif`", e)
        elif t is nodes.Macro:
            add(S, "`macro`", node)
            if node.defaults:
                add(S, "`macro` with default arguments", node)
        elif t is nodes.CallBlock:
            add(S, "`call` block (caller)", node)
        elif t is nodes.FilterBlock:
            add(S, "`filter` block", node)
            for f in [node.filter]:
                add(S, f"`filter` block: `{f.name}`", node)
        elif t is nodes.Assign:
            if isinstance(node.target, nodes.NSRef):
                add(S, "`set ns.attr = ...` (namespace attribute)", node)
            elif isinstance(node.target, nodes.Tuple):
                add(S, "`set a, b = ...` (tuple unpacking)", node)
            else:
                add(S, "`set x = ...`", node)
        elif t is nodes.AssignBlock:
            add(S, "`set x %}...{% endset` (block set)", node)
            if node.filter is not None:
                add(S, "block set with a filter", node)
        elif t is nodes.With:
            add(S, "`with`", node)
        elif t is nodes.Break:
            add(S, "`break`", node)
        elif t is nodes.Continue:
            add(S, "`continue`", node)
        elif t is nodes.ExprStmt:
            add(S, "`do` (expression statement)", node)
        elif t in (nodes.Include, nodes.Import, nodes.FromImport, nodes.Extends, nodes.Block):
            add(S, f"`{t.__name__.lower()}`", node)
        elif t is nodes.Output:
            for c in node.nodes:
                if not isinstance(c, nodes.TemplateData):
                    add(S, "`{{ expression }}` output", c)
        elif t is nodes.Filter:
            add("Filters", f"`{node.name}`", node)
            if node.args or node.kwargs:
                sig = [f"{len(node.args)} positional"] if node.args else []
                sig += [f"{k.key}=" for k in node.kwargs]
                add("Filter argument forms", f"`{node.name}(` {', '.join(sig)} `)`", node)
            if node.name in ("selectattr", "rejectattr", "select", "reject", "map") and node.args:
                a = [x.value if isinstance(x, nodes.Const) else "<expr>" for x in node.args]
                add("Filter argument forms", f"`{node.name}` args {a!r}", node)
            if node.node is None:
                pass
        elif t is nodes.Test:
            add("Tests (`is ...`)", f"`{node.name}`", node)
            if node.args or node.kwargs:
                add("Tests (`is ...`)", f"`{node.name}` with an argument", node)
            if isinstance(parent, nodes.Not):
                add("Tests (`is ...`)", "`is not ...`", node)
        elif t is nodes.Call:
            f = node.node
            if isinstance(f, nodes.Getattr):
                add("Method calls (`x.m(...)`)", f"`.{f.attr}()`", node)
                if f.attr in ("split", "rsplit", "strip", "lstrip", "rstrip", "replace",
                              "startswith", "endswith", "get", "items", "format", "join",
                              "append", "update", "count", "find", "upper", "lower",
                              "title", "keys", "values", "splitlines", "pop"):
                    n = len(node.args)
                    add("Method call argument counts", f"`.{f.attr}()` with {n} positional args"
                        + (f", kwargs {[k.key for k in node.kwargs]}" if node.kwargs else ""),
                        node)
                if isinstance(f.node, nodes.Name) and f.node.name == "loop":
                    add("`loop` variable", f"`loop.{f.attr}(...)`", node)
            elif isinstance(f, nodes.Name) and f.name in macros:
                add("Function calls (globals, macros, `caller`)",
                    "call of a macro defined in the template", node)
            elif isinstance(f, nodes.Name):
                add("Function calls (globals, macros, `caller`)", f"`{f.name}()`", node)
                if f.name == "loop":
                    add("`loop` variable", "`loop(...)` (recursive call)", node)
            else:
                add("Function calls (globals, macros, `caller`)", f"call of a {type(f).__name__}",
                    node)
            if node.kwargs:
                add("Expressions", "call with keyword arguments", node)
            if node.dyn_args or node.dyn_kwargs:
                add("Expressions", "call with `*args`/`**kwargs`", node)
        elif t in BINOPS:
            add("Operators", BINOPS[t], node)
            if t is nodes.Mod and isinstance(node.left, nodes.Const) and isinstance(
                    node.left.value, str):
                add("Operators", "`'...' % value` (printf-style string formatting)", node)
        elif t is nodes.Concat:
            add("Operators", "`~` (string concatenation)", node)
        elif t in UNOPS:
            add("Operators", UNOPS[t], node)
        elif t is nodes.Compare:
            for op in node.ops:
                add("Operators", CMPOPS.get(op.op, op.op), node)
            if len(node.ops) > 1:
                add("Operators", "chained comparison (`a < b < c`)", node)
        elif t is nodes.CondExpr:
            add("Expressions", "inline `a if cond else b`", node)
            if node.expr2 is None:
                add("Expressions", "inline `a if cond` without `else`", node)
        elif t is nodes.Getitem:
            if isinstance(node.arg, nodes.Slice):
                s = node.arg
                form = "[{}:{}{}]".format("a" if s.start else "", "b" if s.stop else "",
                                          (":" + (str(s.step.value) if isinstance(
                                              s.step, nodes.Const) else "c")) if s.step else "")
                add("Subscripts and attributes", f"slice `x{form}`", node)
                for part in (s.start, s.stop, s.step):
                    if isinstance(part, nodes.Neg) or (
                            isinstance(part, nodes.Const) and isinstance(part.value, int)
                            and part.value < 0):
                        add("Subscripts and attributes", "slice with a negative bound", node)
                        break
            elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str):
                add("Subscripts and attributes", "`x['key']` (string subscript)", node)
            elif isinstance(node.arg, nodes.Neg) or (
                    isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, int)
                    and node.arg.value < 0):
                add("Subscripts and attributes", "`x[-1]` (negative index)", node)
            elif isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, int):
                add("Subscripts and attributes", "`x[0]` (integer index)", node)
            else:
                add("Subscripts and attributes", "`x[expr]` (computed subscript)", node)
        elif t is nodes.Getattr:
            if isinstance(node.node, nodes.Name) and node.node.name == "loop":
                add("`loop` variable", f"`loop.{node.attr}`", node)
            elif not isinstance(parent, nodes.Call) or parent.node is not node:
                add("Subscripts and attributes", "`x.attr` (attribute access, not a call)", node)
        elif t is nodes.Const:
            v = node.value
            kind = {bool: "boolean", int: "integer", float: "float", str: "string",
                    type(None): "none"}.get(type(v), type(v).__name__)
            add("Literals", f"{kind} constant", node)
        elif t is nodes.List:
            add("Literals", "list literal `[...]`", node)
        elif t is nodes.Tuple and node.ctx == "load":
            add("Literals", "tuple literal `(a, b)`", node)
        elif t is nodes.Dict:
            add("Literals", "dict literal `{...}`", node)
        elif t is nodes.Name and node.ctx == "load" and node.name in (
                "true", "false", "none", "True", "False", "None"):
            pass
        for child in node.iter_child_nodes():
            visit(child, node)

    visit(ast)

    # Scoping: a name set inside a for body and also set outside any loop (the loop's
    # assignment does not change the outer variable; namespace() is the way out).
    def sets_in(body_nodes):
        out = set()
        for n in body_nodes:
            for a in ([n] if isinstance(n, nodes.Assign) else []) + list(n.find_all(nodes.Assign)):
                if isinstance(a.target, nodes.Name):
                    out.add((a.target.name, a.lineno))
        return out
    inner = set()
    for f in ast.find_all(nodes.For):
        inner |= sets_in(f.body)
    macro_inner = set()
    for m in ast.find_all(nodes.Macro):
        macro_inner |= sets_in(m.body)
    all_sets = sets_in(ast.body)
    outer_names = {n for n, ln in all_sets - inner - macro_inner}
    for n, ln in sorted(inner):
        add("Statements", "`set x` inside a `for` body (loop-scoped)", lineno=ln)
        if n in outer_names:
            add("Statements", "`set x` in a loop of a name also set outside loops "
                "(outer value unchanged after the loop)", lineno=ln)
    for n, ln in sorted(macro_inner):
        add("Statements", "`set x` inside a `macro` body", lineno=ln)
    ns_names = {a.target.name for a in ast.find_all(nodes.Assign)
                if isinstance(a.target, nodes.Name) and isinstance(a.node, nodes.Call)
                and isinstance(a.node.node, nodes.Name) and a.node.node.name == "namespace"}
    for a in ast.find_all(nodes.Assign):
        if isinstance(a.target, nodes.NSRef) and a.target.name not in ns_names:
            add("Statements", "`set x.attr = ...` where x is not a namespace() "
                "(TemplateRuntimeError when executed)", a)
    for m in ast.find_all(nodes.Macro):
        if any(isinstance(c.node, nodes.Name) and c.node.name == m.name
               for c in m.find_all(nodes.Call)):
            add("Statements", "recursive `macro` (calls itself)", m)

    # Names used inside macros that are implicit (caller/varargs/kwargs).
    for m in ast.find_all(nodes.Macro):
        used = {n.name for n in m.find_all(nodes.Name)}
        for implicit in ("caller", "varargs", "kwargs"):
            if implicit in used:
                add("Statements", f"`macro` body uses `{implicit}`", m)
    # Literal True/False/None spellings
    for n in ast.find_all(nodes.Const):
        pass


NOTES = """## Semantics a reimplementation must match (checked with jinja2 3.1 and the oracle's settings)

- **Whitespace**: `trim_blocks` drops the first newline after a `{% %}` tag (and a `{# #}`
  comment), never after `{{ }}`; `lstrip_blocks` drops spaces/tabs between the start of a line
  and a `{%` / `{#` tag (not `{{`). `-` on any delimiter strips all whitespace (newlines
  included) on that side; `{%+` turns lstrip off for that tag (unused here).
  `keep_trailing_newline=False`: one final `\n` of the template source is dropped (23 of
  the 40 files end with a newline).
- **Printing values** (`{{ x }}`, `|string`, `~`, `|join`): Python `str()`: `True`/`False`/`None`,
  floats as Python repr (`1.0`, `1e+16`), lists and dicts as Python repr
  (`{'a': [1, True, None, "x'y"]}`: single quotes unless the string holds a `'` and no `"`).
  Undefined prints as the empty string.
- **`tojson`** is `json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`:
  `", "` and `": "`, non-ASCII kept, no HTML escaping, key order kept; with `indent=N`
  items end with `","` + newline (no trailing space), nested levels indented N more.
- **Attribute vs item**: `x.name` tries the Python attribute first, then `x['name']`; on a dict,
  `x.items` / `x.get` / `x.keys` / `x.values` are the *methods* even if the dict has such a key
  (`json_spec.items` of an array schema is the bound method, printed as
  `<built-in method items of dict object at 0x...>`). `x['name']` tries the item first.
  A missing key or attribute is Undefined (no error until it is used as a value in a way
  that needs one: `undefined.attr`, calling it, iterating is fine: empty).
- **Immutable sandbox**: `list.append/pop/extend/insert/remove/sort`, `dict.update/pop/setdefault/clear`
  raise `SecurityError` ("access to attribute 'append' of 'list' object is unsafe.").
  `set x.attr = ...` on anything but a `namespace()` raises `TemplateRuntimeError`.
- **Scoping**: `set` inside a `for` body (or a macro) is local to that iteration / call;
  after the loop the outer variable keeps its old value. `namespace()` attributes survive.
  Macros see template-level variables and the context, not the caller's loop variables.
- **Markup** (`|safe`): with autoescape off output is unchanged, but the `+` operator with a
  Markup operand on either side HTML-escapes the plain-str operand (`"'"|safe + "<b>"` gives
  `'&lt;b&gt;`; `x + y|safe` escapes `x`); `~` does not (it joins as plain str).
- **Operators**: `/` is true division (`7/2` = 3.5), `//` floor, `%` modulo or printf-style
  formatting on a str left operand, `*` repeats strings/lists, `+` concatenates str+str and
  list+list (str+int raises TypeError), `in` is substring / list membership / dict key.
  `1 == 1.0` is true; `true is number` is true (bool is int).
- **Tests**: `string`, `mapping` (dict), `sequence` and `iterable` (both true for strings,
  lists, dicts), `number`, `boolean`, `none`, `true`/`false` (identity with the booleans),
  `defined`/`undefined`, `equalto`, `sameas`.
- **Filters with defaults that bite**: `dictsort` and `sort` and `unique` compare case-insensitively
  by default; `default(v)` replaces only undefined, `default(v, true)` also falsy values;
  `indent(n)` skips the first line and blank lines unless `first=true`/`blank=true`;
  `list` of a string gives its characters, of a dict its keys; `trim` / `.strip()` strip Unicode
  whitespace; `length` counts code points (strings), items (lists) or keys (dicts);
  `capitalize` lowercases the rest.
- **`loop`**: `index`, `index0`, `first`, `last`, `length`, `revindex`, `previtem` / `nextitem`
  (Undefined at the ends), `cycle`, `changed`, `depth`; with `for x in y if cond` the filter
  runs before `loop` is built (indices count only kept items).
- **Unknown filters and tests**: a compile-time TemplateSyntaxError ("No filter named
  'from_json'.") unless the use sits inside an `if` body, where jinja2 defers it: the template
  compiles and raises TemplateRuntimeError ("No filter named 'from_json' found.") only when
  that branch runs (deepseek-ai-DeepSeek-V4 renders unless a tool call's arguments are a string).
- **Macros** see the template's top-level variables and the context, not the caller's
  local or loop variables (MiroThinker's `render_tool` reads the caller's loop variable
  `tool`: UndefinedError). A macro called with fewer arguments gets Undefined for the rest
  (or the defaults).
- **Errors**: `raise_exception(msg)` raises TemplateError(msg); the oracle prints
  `error: raise_exception: msg`. Other runtime errors are Python's own (TypeError for
  `str + dict`, `None` iterated, json.dumps of a generator from `map(...)|tojson`).
"""


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--templates", default=os.path.normpath(
        os.path.join(here, "..", "..", "..", "shared", "testdata", "chat_templates")))
    args = ap.parse_args()

    env = oracle.make_environment(oracle.DEFAULT_NOW)
    inv = Inventory()
    files = sorted(f for f in os.listdir(args.templates) if f.endswith(".jinja"))
    failed = {}
    for f in files:
        name = f[:-len(".jinja")]
        with open(os.path.join(args.templates, f), encoding="utf-8", newline="") as fh:
            src = fh.read()
        try:
            walk_template(inv, name, src, env)
        except jinja2.TemplateError as e:
            failed[name] = f"{type(e).__name__}: {e}"

    out = []
    w = out.append
    w("# Jinja features used by the real chat templates\n")
    w(f"Generated by `tests/jinja/features.py` from the {len(files)} templates in "
      "`testdata/chat_templates` (jinja2 " + jinja2.__version__ + "'s lexer and parser, "
      "trim_blocks + lstrip_blocks + loopcontrols, then an AST walk). "
      "*uses* = occurrences in all templates; *templates* = how many templates use it; "
      "the example is the first use found (template:line). "
      "Templates are listed in full where 6 or fewer use a feature.\n")
    if failed:
        w("Templates jinja2 cannot parse (not counted):\n")
        for k, v in failed.items():
            w(f"- `{k}`: {v}")
        w("")
    order = ["Statements", "`loop` variable", "Filters", "Filter argument forms",
             "Tests (`is ...`)", "Method calls (`x.m(...)`)", "Method call argument counts",
             "Function calls (globals, macros, `caller`)", "Operators", "Expressions",
             "Subscripts and attributes", "Literals", "Delimiters and whitespace control",
             "Free variables (read from the context or globals)"]
    by_section = collections.defaultdict(list)
    for key in inv.uses:
        by_section[key[0]].append(key)
    for sec in order + sorted(set(by_section) - set(order)):
        feats = by_section.get(sec)
        if not feats:
            continue
        w(f"## {sec}\n")
        w("| feature | uses | templates | which / example |")
        w("| --- | ---: | ---: | --- |")
        feats.sort(key=lambda f: (-len(inv.uses[f]), -sum(inv.uses[f].values()), f))
        for key in feats:
            feat = key[1]
            u = inv.uses[key]
            tmpl = sorted(u)
            if len(tmpl) <= 6:
                which = ", ".join(tmpl)
            else:
                which = ", ".join(sorted(tmpl, key=lambda t: -u[t])[:3]) + ", ..."
            ex = inv.example.get(key)
            if ex and ex[2]:
                code = ex[2].replace("|", "\\|").replace("`", "'")
                which += f"<br>e.g. {ex[0]}:{ex[1]} `{code}`"
            w(f"| {feat} | {sum(u.values())} | {len(u)} | {which} |")
        w("")
    w(NOTES)
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main()
