#!/usr/bin/env python3
"""`encore template` against the oracle (python3-jinja2 set up as transformers does),
byte for byte, for every chat template x conversation.

    compare.py --encore build/encore [--shared ../shared | --templates DIR]
               [--conversations DIR] [--only SUBSTRING] [--verbose] [--jobs 2]
    compare.py --oracle-only     # the oracle's own outcome per cell (no encore)
    compare.py --self-test       # the harness finds a wrong renderer (no encore, no data)
    compare.py --encore build/encore --cases tests/jinja/cases [--only SUBSTRING] [-v]
                                 # the synthetic edge cases, each with its own context

Each cell is one of (code in the table):
  =   equal        same bytes
  E   both-error   the oracle raised and encore exited 1 with one `error: ...` line
                   (for the template's raise_exception(msg): encore's line contains msg)
  Em  both-error, but encore's line lacks the raise_exception message     -> failure
  R   refused      encore exited 1 saying "unsupported"/"not supported" while the
                   oracle rendered, or raised but not with that message (allowed on
                   at most 2 templates)
  D   DIFF         both rendered, the bytes differ                          -> failure
  O   encore rendered where the oracle raised (transformers would raise)     -> failure
  X   encore-error encore exited 1 otherwise while the oracle rendered       -> failure
  C   crash        encore exited with a code other than 0/1 (or a signal)   -> failure
  T   timeout      encore took more than --timeout seconds (10)              -> failure
Exit status: 0 when nothing failed and at most 2 templates have an R cell; 1 otherwise;
77 (with --skip-missing) when python3-jinja2 or the templates folder is missing; 2 on bad
arguments. A normal run starts with the self-test (under a second).

--cases DIR: every DIR/NAME.jinja (a small template that exercises one feature) is rendered
with DIR/NAME.json when it exists, else DIR/context.json, and classified as above, except
for refusals: a case whose text contains `{# encore-refuses: WHY #}` must come out `R` (a
construct encore deliberately refuses), and any other case that comes out `R` fails.
"""
import argparse
import concurrent.futures
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SKIP = 77
MAX_REFUSED_TEMPLATES = 2
FAILING = {"Em", "D", "O", "X", "C", "T"}
LEGEND = ("`=` equal, `E` both error, `Em` both error but encore lacks the "
          "raise_exception message, `R` refused (unsupported), `D` DIFF, `O` encore rendered "
          "where the oracle raised, `X` encore error, `C` crash, `T` timeout; "
          "`o` (--oracle-only) the oracle rendered")
REFUSED_RE = re.compile(r"unsupported|not supported", re.IGNORECASE)


def load_oracle(skip_missing):
    try:
        sys.path.insert(0, HERE)
        import oracle  # noqa: F401  (imports jinja2)
        return oracle
    except ImportError as e:
        msg = f"python3-jinja2 is missing ({e}); install it: scripts/setup.sh"
        if skip_missing:
            print(f"SKIP: {msg}")
            sys.exit(SKIP)
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)


class Cell:
    __slots__ = ("template", "conv", "code", "oracle_ok", "oracle_out", "rc", "out", "err",
                 "seconds", "note")

    def __init__(self, template, conv):
        self.template, self.conv = template, conv
        self.code = self.note = None
        self.oracle_ok = self.oracle_out = self.rc = self.out = self.err = None
        self.seconds = 0.0


def run_encore(encore, tfile, cfile, now, timeout):
    """(rc, stdout bytes, stderr text, seconds); rc None on a timeout."""
    cmd = [encore, "template", "--file", tfile, "--context", cfile, "--now", now]
    env = dict(os.environ, LC_ALL="C")
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        return None, e.stdout or b"", (e.stderr or b"").decode("utf-8", "replace"), timeout
    return (p.returncode, p.stdout, p.stderr.decode("utf-8", "backslashreplace"),
            time.monotonic() - t0)


def classify(cell):
    """Sets cell.code (and a note) from the oracle's and encore's outcomes."""
    if cell.rc is None:
        cell.code = "T"
        return
    if cell.rc not in (0, 1):
        cell.code = "C"
        cell.note = f"exit status {cell.rc}"
        return
    err_lines = cell.err.rstrip("\n").split("\n") if cell.err.strip() else []
    if cell.rc == 0:
        if not cell.oracle_ok:
            cell.code = "O"
            return
        expected = cell.oracle_out.encode("utf-8")
        cell.code = "=" if cell.out == expected else "D"
        return
    # encore exited 1
    one_line = len(err_lines) == 1 and err_lines[0].startswith("error: ")
    refused = bool(REFUSED_RE.search(cell.err))
    if cell.oracle_ok:
        cell.code = "R" if refused else "X"
        return
    cell.code = "E"
    prefix = "error: raise_exception: "
    if cell.oracle_out.startswith(prefix):
        msg = cell.oracle_out[len(prefix):]
        if msg not in cell.err:
            # A refusal (unsupported feature) counts as refused even where the
            # template would have raised its own exception.
            cell.code = "R" if refused else "Em"
            cell.note = None if refused else f"expected the message {msg!r}"
    if not one_line and cell.code == "E":
        cell.note = "stderr is not one `error: ...` line"


def first_difference(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def show_bytes(b):
    return b.decode("utf-8", "backslashreplace").encode("unicode_escape").decode("ascii")


def describe(cell, verbose):
    lines = []
    head = f"[{cell.code}] {cell.template} x {cell.conv}"
    if cell.note:
        head += f": {cell.note}"
    lines.append(head)
    if not verbose:
        return lines
    if cell.code == "D":
        exp = cell.oracle_out.encode("utf-8")
        i = first_difference(exp, cell.out)
        lo = max(0, i - 80)
        lines.append(f"    first difference at byte {i} (oracle {len(exp)} bytes, "
                     f"encore {len(cell.out)} bytes)")
        lines.append(f"    oracle: ...{show_bytes(exp[lo:i])}>>>{show_bytes(exp[i:i + 80])}")
        lines.append(f"    encore: ...{show_bytes(cell.out[lo:i])}>>>"
                     f"{show_bytes(cell.out[i:i + 80])}")
    if cell.oracle_ok is False:
        lines.append(f"    oracle: {cell.oracle_out}")
    if cell.err:
        lines.append("    encore stderr: " + cell.err.strip().replace("\n", "\n        "))
    return lines


def list_inputs(args):
    if not os.path.isdir(args.templates):
        msg = f"no chat templates at {args.templates} (the shared data folder: --shared)"
        if args.skip_missing:
            print(f"SKIP: {msg}")
            sys.exit(SKIP)
        print(f"error: {msg}", file=sys.stderr)
        sys.exit(2)
    templates = sorted(f for f in os.listdir(args.templates) if f.endswith(".jinja"))
    if args.only:
        templates = [t for t in templates if args.only.lower() in t.lower()]
    convs = sorted(f for f in os.listdir(args.conversations) if f.endswith(".json"))
    if not templates or not convs:
        print(f"error: nothing to compare ({len(templates)} templates, {len(convs)} "
              "conversations)", file=sys.stderr)
        sys.exit(2)
    return templates, convs


def render_table(templates, convs, cells):
    short = [c.split("-")[0] for c in convs]
    out = ["| template | " + " | ".join(short) + " |",
           "| --- |" + " :-: |" * len(convs)]
    for t in templates:
        row = [cells[(t, c)].code for c in convs]
        out.append(f"| {t[:-len('.jinja')]} | " + " | ".join(row) + " |")
    out.append("")
    out.append("Conversations: " + ", ".join(f"{s} = {c[:-len('.json')]}"
                                              for s, c in zip(short, convs)))
    out.append("")
    out.append("Legend: " + LEGEND)
    return "\n".join(out)


def compare(args, oracle_mod, out=sys.stdout):
    """The full comparison; returns the exit status."""
    templates, convs = list_inputs(args)
    orc = oracle_mod.Oracle(args.now)
    contexts = {c: oracle_mod.read_context(os.path.join(args.conversations, c)) for c in convs}
    cells = {}
    for t in templates:
        src = oracle_mod.read_template(os.path.join(args.templates, t))
        for c in convs:
            cell = Cell(t, c)
            cell.oracle_ok, cell.oracle_out = orc.render(src, copy.deepcopy(contexts[c]))
            cells[(t, c)] = cell

    if args.oracle_only:
        for cell in cells.values():
            cell.code = "o" if cell.oracle_ok else "E"
        print(render_table(templates, convs, cells), file=out)
        errs = [c for c in cells.values() if not c.oracle_ok]
        print(f"\nThe oracle rendered {len(cells) - len(errs)} of {len(cells)} cells; "
              f"it raised in {len(errs)}:\n", file=out)
        for c in errs:
            print(f"- {c.template[:-6]} x {c.conv[:-5]}: {c.oracle_out}", file=out)
        return 0

    t0 = time.monotonic()

    def job(cell):
        cell.rc, cell.out, cell.err, cell.seconds = run_encore(
            args.encore, os.path.join(args.templates, cell.template),
            os.path.join(args.conversations, cell.conv), args.now, args.timeout)
        classify(cell)
        return cell

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(job, cells.values()))
    wall = time.monotonic() - t0

    print(render_table(templates, convs, cells), file=out)
    counts = {}
    for cell in cells.values():
        counts[cell.code] = counts.get(cell.code, 0) + 1
    refused = sorted({c.template for c in cells.values() if c.code == "R"})
    failing = [c for c in cells.values() if c.code in FAILING]
    noted = [c for c in cells.values() if c.note and c.code not in FAILING]
    print("\n## Summary\n", file=out)
    print(f"{len(cells)} cells ({len(templates)} templates x {len(convs)} conversations) in "
          f"{wall:.1f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
          file=out)
    raised = [c for c in cells.values()
              if not c.oracle_ok and c.oracle_out.startswith("error: raise_exception: ")]
    if raised:
        agree = sum(1 for c in raised if c.code == "E")
        print(f"cells where the template calls raise_exception: {len(raised)}; encore's error "
              f"line carries the message in {agree}", file=out)
    slowest = max(cells.values(), key=lambda c: c.seconds)
    print(f"slowest encore render: {slowest.seconds:.2f} s ({slowest.template} x "
          f"{slowest.conv})", file=out)
    if refused:
        print(f"templates with refused cells ({len(refused)}, at most "
              f"{MAX_REFUSED_TEMPLATES} allowed): " + ", ".join(refused), file=out)
    listed = failing + [c for c in cells.values() if c.code == "R"] + noted
    limit = len(listed) if args.verbose else 40
    for cell in listed[:limit]:
        print("\n".join(describe(cell, args.verbose)), file=out)
    if len(listed) > limit:
        print(f"... and {len(listed) - limit} more (--verbose lists them all)", file=out)
    ok = not failing and len(refused) <= MAX_REFUSED_TEMPLATES
    print(f"\n{'PASS' if ok else 'FAIL'}: {len(failing)} failing cells, "
          f"{len(refused)} templates refused", file=out)
    return 0 if ok else 1


SELF_TEST_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}"
                      "{{ raise_exception('System role not supported') }}{% endif %}"
                      "<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}"
                      "{% if add_generation_prompt %}<assistant>{% endif %}\n")

# A stand-in for `encore template` that renders with the oracle, then misbehaves as told.
FAKE_ENCORE = r'''#!/usr/bin/env python3
import sys
sys.path.insert(0, {here!r})
import oracle
mode = {mode!r}
a = sys.argv[1:]
assert a[0] == "template", a
args = dict(zip(a[1::2], a[2::2]))
ok, out = oracle.Oracle(args["--now"]).render(oracle.read_template(args["--file"]),
                                               oracle.read_context(args["--context"]))
if mode == "crash":
    sys.exit(134)
if mode == "refuse":
    sys.stderr.write("error: unsupported Jinja feature: everything\n"); sys.exit(1)
if mode == "errors-only":
    sys.stderr.write("error: something went wrong\n"); sys.exit(1)
if not ok:
    if mode == "wrong-message":
        sys.stderr.write("error: some other message\n"); sys.exit(1)
    sys.stderr.write(out + "\n"); sys.exit(1)
if mode == "wrong":
    out = out.replace("\n", " \n", 1)      # one added space
if mode == "no-newline-drop":
    out = out + "\n"
sys.stdout.buffer.write(out.encode("utf-8"))
'''


def self_test(oracle_mod):
    """The harness must call a correct renderer equal and catch a wrong one."""
    tmp = tempfile.mkdtemp(prefix="jinja-selftest-")
    try:
        tdir, cdir = os.path.join(tmp, "t"), os.path.join(tmp, "c")
        os.makedirs(tdir)
        os.makedirs(cdir)
        with open(os.path.join(tdir, "tiny.jinja"), "w", encoding="utf-8") as f:
            f.write(SELF_TEST_TEMPLATE)
        base = {"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": True}
        for name, msgs in (("1-user", [{"role": "user", "content": " héllo 😀 "}]),
                           ("2-system", [{"role": "system", "content": "x"},
                                         {"role": "user", "content": "y"}])):
            with open(os.path.join(cdir, name + ".json"), "w", encoding="utf-8") as f:
                json.dump({"messages": msgs, **base}, f, ensure_ascii=False)
        expect = {  # mode -> (code for 1-user, code for 2-system, exit status)
            "correct": ("=", "E", 0), "wrong": ("D", "E", 1),
            "no-newline-drop": ("D", "E", 1), "wrong-message": ("=", "Em", 1),
            "refuse": ("R", "R", 0), "errors-only": ("X", "Em", 1), "crash": ("C", "C", 1),
        }
        problems = []
        for mode, (c1, c2, status) in expect.items():
            exe = os.path.join(tmp, f"encore-{mode}")
            with open(exe, "w", encoding="utf-8") as f:
                f.write(FAKE_ENCORE.format(here=HERE, mode=mode))
            os.chmod(exe, 0o755)
            args = argparse.Namespace(
                encore=exe, templates=tdir, conversations=cdir, only=None, verbose=True,
                jobs=2, timeout=10, now=oracle_mod.DEFAULT_NOW, oracle_only=False,
                skip_missing=False)
            log = _Capture()
            got_status = compare(args, oracle_mod, out=log)
            got = (_cell_code(log.text, 0), _cell_code(log.text, 1), got_status)
            if got != (c1, c2, status):
                problems.append(f"renderer '{mode}': expected {(c1, c2, status)}, got {got}\n"
                                + log.text)
        # The oracle itself: trim_blocks/lstrip_blocks, the dropped final newline, tojson.
        env = oracle_mod.make_environment()
        src = "  {% if true %}\n{{ x | tojson }}{% endif %}\n"
        got = env.from_string(src).render(x={"b": "é", "a": [1, None]})
        if got != '{"b": "é", "a": [1, null]}':
            problems.append(f"oracle settings: got {got!r}")
        if problems:
            print("self-test FAILED:\n" + "\n".join(problems))
            return 1
        print(f"self-test passed ({len(expect)} stand-in renderers classified as expected)")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class _Capture:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def _cell_code(table_text, column):
    for line in table_text.splitlines():
        if line.startswith("| tiny |"):
            return line.strip("| ").split(" | ")[1 + column]
    return None


REFUSES_MARK = "{# encore-refuses:"


def compare_cases(args, oracle_mod, out=sys.stdout):
    """The synthetic cases (--cases DIR): one cell per template; returns the exit status."""
    names = sorted(f for f in os.listdir(args.cases) if f.endswith(".jinja"))
    if args.only:
        names = [n for n in names if args.only.lower() in n.lower()]
    if not names:
        print(f"error: no .jinja cases in {args.cases}", file=sys.stderr)
        return 2
    orc = oracle_mod.Oracle(args.now)
    cells, expect_refused = [], {}
    for name in names:
        tfile = os.path.join(args.cases, name)
        cfile = os.path.join(args.cases, name[:-len(".jinja")] + ".json")
        if not os.path.isfile(cfile):
            cfile = os.path.join(args.cases, "context.json")
        src = oracle_mod.read_template(tfile)
        cell = Cell(tfile, cfile)
        cell.oracle_ok, cell.oracle_out = orc.render(src, oracle_mod.read_context(cfile))
        expect_refused[tfile] = REFUSES_MARK in src
        cells.append(cell)

    def job(cell):
        cell.rc, cell.out, cell.err, cell.seconds = run_encore(
            args.encore, cell.template, cell.conv, args.now, args.timeout)
        classify(cell)
        # The refusals are part of the contract: expected where marked (whatever the oracle
        # does: it may fail too, as for an include without a loader), a failure elsewhere.
        refused = cell.rc == 1 and bool(REFUSED_RE.search(cell.err))
        if expect_refused[cell.template] and refused:
            cell.code = "R"
        elif expect_refused[cell.template]:
            cell.note = f"expected a refusal ({REFUSES_MARK} ...), got {cell.code}"
            cell.code = "!R"
        elif not expect_refused[cell.template] and cell.code == "R":
            cell.note = f"refused, but the case has no {REFUSES_MARK} ... mark"
            cell.code = "R!"
        return cell

    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(job, cells))
    wall = time.monotonic() - t0
    counts = {}
    for cell in cells:
        counts[cell.code] = counts.get(cell.code, 0) + 1
    failing = [c for c in cells if c.code in FAILING or c.code in ("!R", "R!")]
    print("| case | context | code |\n| --- | --- | :-: |", file=out)
    for cell in cells:
        print(f"| {os.path.basename(cell.template)[:-len('.jinja')]} | "
              f"{os.path.basename(cell.conv)} | {cell.code} |", file=out)
    print(f"\n{len(cells)} cases in {wall:.1f} s: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())), file=out)
    print("Legend: " + LEGEND + "; `!R` a marked case encore did not refuse, `R!` an "
          "unmarked case encore refused", file=out)
    for cell in failing + [c for c in cells if c.code == "R"]:
        cell.template = os.path.basename(cell.template)
        cell.conv = os.path.basename(cell.conv)
        print("\n".join(describe(cell, args.verbose)), file=out)
    print(f"\n{'PASS' if not failing else 'FAIL'}: {len(failing)} failing cases", file=out)
    return 0 if not failing else 1


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("--encore", help="the encore binary")
    ap.add_argument("--shared", default=os.environ.get("ENCORE_SHARED_DIR",
                                                       os.path.join(REPO, "..", "shared")),
                    help="the shared data folder (default: $ENCORE_SHARED_DIR or ../shared)")
    ap.add_argument("--templates", help="default: SHARED/testdata/chat_templates")
    ap.add_argument("--conversations", default=os.path.join(HERE, "conversations"))
    ap.add_argument("--only", metavar="TEMPLATE_SUBSTRING")
    ap.add_argument("--cases", metavar="DIR",
                    help="compare the synthetic cases in DIR (each with its own context)")
    ap.add_argument("--verbose", "-v", action="store_true")
    ap.add_argument("--jobs", type=int, default=2, help="encore renders at once (2)")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per render (10)")
    ap.add_argument("--now", default="2024-07-26T08:30:00Z")
    ap.add_argument("--oracle-only", action="store_true")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--skip-missing", action="store_true",
                    help="exit 77 (skip) when python3-jinja2 or the templates are missing")
    args = ap.parse_args(argv)
    if args.templates is None:
        args.templates = os.path.join(args.shared, "testdata", "chat_templates")
    oracle_mod = load_oracle(args.skip_missing)
    if args.self_test:
        return self_test(oracle_mod)
    if args.oracle_only:
        return compare(args, oracle_mod)
    if not args.encore:
        ap.error("--encore is required (or --oracle-only / --self-test)")
    if not (os.path.isfile(args.encore) and os.access(args.encore, os.X_OK)):
        print(f"error: no executable encore at {args.encore}", file=sys.stderr)
        return 2
    if args.cases:
        if self_test(oracle_mod) != 0:
            return 1
        return compare_cases(args, oracle_mod)
    list_inputs(args)  # skip (77) before the self-test when the data is missing
    if self_test(oracle_mod) != 0:
        return 1
    return compare(args, oracle_mod)


if __name__ == "__main__":
    sys.exit(main())
