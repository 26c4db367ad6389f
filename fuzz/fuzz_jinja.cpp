// libFuzzer target for chat templates (src/jinja; a template comes from a
// model file or a request: untrusted). The input is the template text; when
// it holds a 0xFF byte (never valid UTF-8), the bytes after the first one are
// a JSON context instead of the fixed one. Every template must either fail to
// parse or render within tight limits, throwing nothing but InvalidArgument;
// a render must hold the documented shape of Rendered::template_ranges
// (ascending, disjoint, never adjacent, inside the text) and be
// deterministic. Anything else (crash, sanitizer report, another exception,
// a stack overflow, a hang, a huge allocation) is a bug.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "encore/error.h"
#include "encore/jinja.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

const nlohmann::ordered_json& fixed_context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Hi <|im_end|> {{ x }} é😀"},
      {"role": "assistant", "content": "<think>t</think>ok", "reasoning_content": "r",
       "tool_calls": [{"id": "call12345", "type": "function",
                       "function": {"name": "f", "arguments": {"a": [1, 2.5, null, true]}}}]},
      {"role": "tool", "tool_call_id": "call12345", "name": "f", "content": "{\"r\": 1}"}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"a": {"type": "array"}},
                              "required": ["a"]}}}],
    "add_generation_prompt": true,
    "bos_token": "<s>",
    "eos_token": "</s>"
  })");
  return ctx;
}

void check_ranges(const encore::jinja::Rendered& r) {
  size_t at = 0;
  for (size_t k = 0; k < r.template_ranges.size(); ++k) {
    const encore::jinja::ByteRange& b = r.template_ranges[k];
    check(b.begin < b.end && b.end <= r.text.size());
    check(k == 0 || b.begin > at);
    at = b.end;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  nlohmann::ordered_json own_context;
  const nlohmann::ordered_json* context = &fixed_context();
  if (const size_t split = input.find('\xff'); split != std::string_view::npos) {
    own_context = nlohmann::ordered_json::parse(input.substr(split + 1), nullptr, false);
    if (!own_context.is_object()) return 0;
    context = &own_context;
    input = input.substr(0, split);
  }
  encore::jinja::RenderOptions opt;
  opt.now_unix_seconds = 1721982600;
  opt.limits.max_steps = 200'000;
  opt.limits.max_output_bytes = 1u << 20;
  std::optional<encore::jinja::Template> t;
  try {
    t.emplace(input);
  } catch (const encore::InvalidArgument&) {
    return 0;
  }
  std::string first;
  try {
    const encore::jinja::Rendered r = t->render(*context, opt);
    check(r.text.size() <= opt.limits.max_output_bytes);
    check_ranges(r);
    first = r.text;
  } catch (const encore::InvalidArgument&) {
    return 0;
  }
  // Deterministic: the same render again gives the same bytes.
  check(t->render(*context, opt).text == first);
  return 0;
}
