#!/usr/bin/env python3
"""The reference renderer for chat templates: python3-jinja2 set up exactly as
Hugging Face transformers' apply_chat_template sets it up.

    oracle.py --file TEMPLATE.jinja --context CONTEXT.json [--now 2024-07-26T08:30:00Z]

Writes the rendered text to stdout, byte for byte (UTF-8, nothing added). On a
template error it writes one line `error: <Kind>: <message>` to stderr and exits 1;
a template's own raise_exception(msg) gives `error: raise_exception: <msg>`.
It mirrors `encore template`, which tests/jinja/compare.py holds to it.

transformers (src/transformers/utils/chat_template_utils.py, _compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
extensions=[AssistantTracker, jinja2.ext.loopcontrols]), the tojson filter replaced by
json.dumps (ensure_ascii=False, no HTML escaping), globals raise_exception and
strftime_now, env.from_string(template), render(**variables). Everything else is
jinja2's default: keep_trailing_newline=False (one trailing newline of the template
source is dropped), autoescape off, Undefined (not StrictUndefined).

Differences from transformers, all deliberate: the context is passed as-is (transformers
always passes tools=None, documents=None and add_generation_prompt; here a variable the
context does not set is undefined), and strftime_now reads a fixed clock (--now, UTC, a
naive datetime like transformers' datetime.now(), so %Z is empty) instead of the wall
clock. Locale-independent: Python leaves LC_TIME at "C" (English month names), files are
read and written as UTF-8 whatever LC_ALL says.
"""
import argparse
import datetime
import json
import sys

import jinja2
import jinja2.ext
import jinja2.sandbox
from jinja2 import nodes

DEFAULT_NOW = "2024-07-26T08:30:00Z"


class RaisedException(jinja2.exceptions.TemplateError):
    """What the template's raise_exception(message) raises (a TemplateError, as in
    transformers; the subclass only lets the error line say where it came from)."""


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %}...{% endgeneration %} block, as a pass-through
    (transformers only records the character offsets of its output, for
    return_assistant_tokens_mask). None of the 40 test templates uses it."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_generation")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_generation(self, caller):
        return caller()


def parse_now(text):
    """'2024-07-26T08:30:00Z' (or with +00:00, or no zone) -> naive UTC datetime."""
    t = text.strip()
    if t.endswith("Z") or t.endswith("z"):
        t = t[:-1] + "+00:00"
    d = datetime.datetime.fromisoformat(t)
    if d.tzinfo is not None:
        d = d.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    return d


def make_environment(now=DEFAULT_NOW):
    if isinstance(now, str):
        now = parse_now(now)

    def raise_exception(message):
        raise RaisedException(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return now.strftime(format)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def read_template(path):
    # newline="": the text exactly as stored (jinja2's lexer normalises newlines itself).
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def read_context(path):
    with open(path, encoding="utf-8") as f:
        ctx = json.load(f)  # dicts keep the file's key order
    if not isinstance(ctx, dict):
        raise ValueError(f"{path}: the context must be one JSON object")
    return ctx


def error_line(exc):
    """One line naming the kind of error and its message (no trailing newline)."""
    if isinstance(exc, RaisedException):
        text = f"raise_exception: {exc.message}"
    elif isinstance(exc, jinja2.exceptions.TemplateSyntaxError):
        text = f"TemplateSyntaxError: {exc.message} (line {exc.lineno})"
    elif isinstance(exc, jinja2.exceptions.TemplateError):
        text = f"{type(exc).__name__}: {exc.message}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return "error: " + " ".join(str(text).split("\n"))


class Oracle:
    """Compiles each template once; render() returns (True, text) or (False, error line)."""

    def __init__(self, now=DEFAULT_NOW):
        self.env = make_environment(now)
        self._compiled = {}

    def compile(self, source):
        if source not in self._compiled:
            try:
                self._compiled[source] = (True, self.env.from_string(source))
            except Exception as e:  # noqa: BLE001 - any failure is the template's
                self._compiled[source] = (False, error_line(e))
        return self._compiled[source]

    def render(self, source, context):
        ok, t = self.compile(source)
        if not ok:
            return False, t
        try:
            return True, t.render(**context)
        except Exception as e:  # noqa: BLE001
            return False, error_line(e)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Render a chat template as transformers does.")
    ap.add_argument("--file", required=True, help="the template (UTF-8 text)")
    ap.add_argument("--context", required=True, help="a JSON object: the template's variables")
    ap.add_argument("--now", default=DEFAULT_NOW, help="the clock of strftime_now (UTC)")
    a = ap.parse_args(argv)
    try:
        source = read_template(a.file)
        context = read_context(a.context)
        oracle = Oracle(a.now)
    except (OSError, ValueError) as e:
        sys.stderr.buffer.write(f"error: {e}\n".encode("utf-8", "backslashreplace"))
        return 1
    ok, out = oracle.render(source, context)
    if not ok:
        sys.stderr.buffer.write((out + "\n").encode("utf-8", "backslashreplace"))
        return 1
    sys.stdout.buffer.write(out.encode("utf-8"))
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
