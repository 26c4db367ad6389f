#!/usr/bin/env python3
"""Random templates: `encore template` against the oracle.

    random_ws.py --encore build/bin/encore [--kind ws|statements] [--count 300] [--seed 1]
                 [--skip-missing]

The real templates and tests/jinja/cases pin whitespace corners one by one; this
draws many small templates that mix them: text with spaces, tabs, newlines and
CRLF; `{%`/`{%-`/`{%+` and `%}`/`-%}`/`+%}` on if, for and block set; `{{-`/`-}}`;
comments with `-`/`+`; raw blocks; a trailing newline or not (--kind ws, empty
context). --kind statements nests for (with else, a loop filter, break and
continue), if/elif/else, set and block set, namespaces, with and macros defined
anywhere, reading loop.* and the variables of cases/context.json. Each must render
to the same bytes in both, or fail in both. Deterministic for a seed. Exit 0
when all agree, 1 otherwise (the first few differences are printed), 77 with
--skip-missing when python3-jinja2 is missing.
"""
import argparse
import copy
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

TEXTS = ["", " ", "  ", "\n", " \n", "\n\n", "\t", "a", " a ", "\n  ", "  \n  ", "x\n", "\r\n",
         " \r\n "]
OPENS, CLOSES = ["{%", "{%-", "{%+"], ["%}", "-%}", "+%}"]
VOPENS, VCLOSES = ["{{", "{{-"], ["}}", "-}}"]
COPENS, CCLOSES = ["{#", "{#-", "{#+"], ["#}", "-#}", "+#}"]


def template(rng):
    def tag(body):
        return rng.choice(OPENS) + " " + body + " " + rng.choice(CLOSES)

    def piece(depth):
        r = rng.random()
        if r < 0.3:
            return rng.choice(TEXTS)
        if r < 0.45:
            return rng.choice(VOPENS) + " 'v' " + rng.choice(VCLOSES)
        if r < 0.55:
            return rng.choice(COPENS) + " c " + rng.choice(CCLOSES)
        if r < 0.62:
            return (tag("raw") + rng.choice(TEXTS) + "{{ r }}" + rng.choice(TEXTS)
                    + tag("endraw"))
        if depth < 3 and r < 0.8:
            return tag("if true") + seq(depth + 1) + tag("endif")
        if depth < 3 and r < 0.9:
            return tag("for i in [1, 2]") + seq(depth + 1) + tag("endfor")
        if depth < 3:
            return tag("set x") + seq(depth + 1) + tag("endset") + "{{ x }}"
        return rng.choice(TEXTS)

    def seq(depth):
        return "".join(piece(depth) for _ in range(rng.randint(1, 5)))

    src = seq(0)
    if rng.random() < 0.3:
        src += rng.choice(["\n", "\n\n", " \n"])
    return src


def statement_template(rng):
    names = ["x", "y", "i", "ns.v", "loop.index", "loop.first", "loop.last", "loop.previtem",
             "loop.length", "m.role", "n", "words", "l"]
    vals = ["1", "'a'", "x", "y", "i", "ns.v", "n", "l|length", "x ~ 'b'", "i * 2",
            "loop.index0", "[i]", "none"]

    def stmt(d):
        r = rng.random()
        if d > 3 or r < 0.25:
            return "{{ %s }}" % rng.choice(names)
        if r < 0.35:
            return "{%% set %s = %s %%}" % (rng.choice(["x", "y"]), rng.choice(vals))
        if r < 0.42:
            return "{%% set ns.v = %s %%}" % rng.choice(vals)
        if r < 0.55:
            seq = rng.choice(["l", "words", "messages", "[]", "range(3)",
                              "l if l|length > 2 else []"])
            return "{%% for %s in %s %%}%s{%% else %%}E{%% endfor %%}" % (
                rng.choice(["i", "m", "x"]), seq, body(d + 1))
        if r < 0.62:
            return "{%% for i in l if i > 1 %%}%s{%% endfor %%}" % body(d + 1)
        if r < 0.72:
            return "{%% if %s %%}%s{%% elif %s %%}%s{%% else %%}%s{%% endif %%}" % (
                rng.choice(vals), body(d + 1), rng.choice(vals), body(d + 1), body(d + 1))
        if r < 0.8:
            return "{%% if loop is defined and %s %%}{%% %s %%}{%% endif %%}" % (
                rng.choice(["true", "i == 1", "loop.first"]), rng.choice(["break", "continue"]))
        if r < 0.87:
            return "{%% macro mm(a, b=2) %%}%s{{ a }}{{ b }}{%% endmacro %%}{{ mm(%s) }}" % (
                body(d + 1), rng.choice(vals))
        if r < 0.93:
            return "{%% with x = %s %%}%s{%% endwith %%}" % (rng.choice(vals), body(d + 1))
        return "{%% set x %%}%s{%% endset %%}" % body(d + 1)

    def body(d):
        return "".join(stmt(d) for _ in range(rng.randint(1, 3)))

    return "{% set ns = namespace(v=0) %}{% set x = 0 %}" + body(0)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--encore", required=True)
    ap.add_argument("--kind", choices=["ws", "statements"], default="ws")
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-missing", action="store_true")
    args = ap.parse_args(argv)
    try:
        sys.path.insert(0, HERE)
        import oracle
    except ImportError as e:
        print(f"{'SKIP' if args.skip_missing else 'error'}: python3-jinja2 is missing ({e})")
        return 77 if args.skip_missing else 2
    env = oracle.make_environment()
    rng = random.Random(args.seed)
    tmp = tempfile.mkdtemp(prefix="jinja-ws-")
    tfile, cfile = os.path.join(tmp, "t.jinja"), os.path.join(tmp, "c.json")
    context = {}
    if args.kind == "statements":
        with open(os.path.join(HERE, "cases", "context.json"), encoding="utf-8") as f:
            context = json.load(f)
    with open(cfile, "w", encoding="utf-8") as f:
        json.dump(context, f, ensure_ascii=False)
    bad = refused = 0
    try:
        for _ in range(args.count):
            src = template(rng) if args.kind == "ws" else statement_template(rng)
            try:
                out = env.from_string(src).render(**copy.deepcopy(context))
                want, ok = out.encode("utf-8"), True
            except Exception as e:  # noqa: BLE001 - the oracle's error is the expectation
                want, ok = str(e).encode("utf-8"), False
            with open(tfile, "w", encoding="utf-8", newline="") as f:
                f.write(src)
            p = subprocess.run([args.encore, "template", "--file", tfile, "--context", cfile,
                                "--now", oracle.DEFAULT_NOW], capture_output=True,
                               env=dict(os.environ, LC_ALL="C"), timeout=10)
            if b"not supported" in p.stderr:
                refused += 1  # a deliberate refusal (a function holding a namespace ...)
                continue
            if (p.returncode == 0) != ok or (ok and p.stdout != want):
                bad += 1
                if bad <= 5:
                    print(f"DIFF {src!r}\n  oracle ({'ok' if ok else 'error'}): {want[:200]!r}\n"
                          f"  encore (exit {p.returncode}): {p.stdout[:200]!r} {p.stderr[:200]!r}")
    finally:
        for f in (tfile, cfile):
            if os.path.exists(f):
                os.remove(f)
        os.rmdir(tmp)
    print(f"{args.count} random {args.kind} templates (seed {args.seed}): {bad} differ, "
          f"{refused} refused as not supported")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
