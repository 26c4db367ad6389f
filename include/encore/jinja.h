// Jinja2 chat templates: the program a model file carries as
// tokenizer.chat_template, run the way Hugging Face transformers'
// apply_chat_template runs it, so that a conversation becomes the exact text
// the model was trained on. One character of difference changes every token
// after it: for a reproducibility engine the template is part of the numerics.
//
// Semantics: a sandboxed Jinja2 environment with trim_blocks and
// lstrip_blocks, the loopcontrols extension ({% break %}, {% continue %}),
// `tojson` as json.dumps(x, ensure_ascii=False, indent, separators,
// sort_keys), the globals raise_exception(msg) and strftime_now(fmt), and
// Python's str()/repr() for printed values. Lists and dicts are immutable
// (append, pop ... are refused as in the ImmutableSandboxedEnvironment); a
// namespace() is the one mutable object. Checked byte for byte against
// python3-jinja2 on real templates (tests/jinja/).
//
// Supported: the statements if / elif / else, for (loop.*, else, an `if`
// filter, tuple targets), set (and {% set %}...{% endset %}), macro (defaults,
// varargs, kwargs, caller), call, filter, with, raw, break, continue and
// transformers' {% generation %}; expressions with Python's operators,
// literals, slices, filters and tests. Anything else is refused when the
// template is parsed, with its line ("chat template line 12: no filter named
// 'from_json'"), as Jinja2 refuses an unknown filter; jinja2's filters that no
// chat template uses (batch, center, format, random ...) and integers past 64
// bits are refused as "not supported".
//
// Determinism: dicts keep their insertion order (JSON objects their key
// order); no locale is consulted; strftime_now reads the clock given in
// RenderOptions, never the system's. Bounded: output bytes, call depth and
// evaluation steps (RenderOptions::limits) end a render with an error, and so
// do values nested over 256 deep, lists over 1M items, strings over 64 MiB
// and a namespace that would hold itself.
//
// Special tokens: every string that comes from the context (message content,
// roles, tool definitions ...) is marked as content, and the marks follow it
// through concatenation, slicing and the string methods; the render returns
// the byte ranges the template wrote itself, so a tokenizer parses special
// tokens only there (tokenizer.h special_ranges). Strings from keys listed in
// RenderOptions::trusted_paths (bos_token, eos_token; a caller may add
// messages' roles once it has checked them) count as template text.
//
// Ownership: a Template owns its parsed program; render() reads it and the
// context and retains nothing. Cost: parse O(template size); render
// proportional to the work the template does, within the limits.
// Thread-safety: a Template is immutable after construction; render() may be
// called concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace encore::jinja {

struct Limits {
  size_t max_output_bytes = 16u << 20;  // rendered text
  int max_call_depth = 100;             // nested macro calls and nested statements
  uint64_t max_steps = 20'000'000;      // evaluated nodes and loop iterations
};

struct RenderOptions {
  // The clock of strftime_now(fmt), in seconds since the Unix epoch (UTC).
  int64_t now_unix_seconds = 0;
  // Where in the context strings are template text rather than content:
  // paths of keys and array indexes from the top, "/" before each, "*" for
  // any one ("/messages/*/role"). A trusted string's keys and items are
  // trusted too.
  std::vector<std::string> trusted_paths = {"/bos_token", "/eos_token", "/unk_token", "/pad_token"};
  Limits limits;
};

// A byte range [begin, end) of a rendered text.
struct ByteRange {
  size_t begin = 0;
  size_t end = 0;
  bool operator==(const ByteRange&) const = default;
};

struct Rendered {
  std::string text;
  // The bytes the template wrote itself (ascending, disjoint, never
  // adjacent); every byte outside them came from a context string.
  std::vector<ByteRange> template_ranges;
};

namespace detail {
struct Program;
}

class Template {
 public:
  // Parses `source` (the Jinja text). Throws InvalidArgument "chat template
  // line N: ..." for a syntax error or an unsupported construct.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the variables of `context`, a JSON object (ordered_json
  // keeps key order, which tojson and dict iteration show). Throws
  // InvalidArgument "chat template line N: ..." for a runtime error, and for
  // raise_exception(msg) "chat template line N: raise_exception: msg".
  Rendered render(const nlohmann::ordered_json& context, const RenderOptions& options) const;

 private:
  std::unique_ptr<const detail::Program> program_;
};

}  // namespace encore::jinja
