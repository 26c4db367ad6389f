// OpenAI request bodies and batch lines -> encore::Request (include/encore/openai.h).
#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "encore/openai.h"
#include "encore/settings.h"

namespace encore::api {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxMessages = 4096;
constexpr size_t kMaxPromptIds = size_t{1} << 20;
// Requests nest about 6 deep; the bound keeps a line of 16 MiB of '[' from
// building millions of nested containers (a memory blow-up, not a parse error).
constexpr size_t kMaxDepth = 64;
constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr size_t kMaxShown = 40;  // bytes of a bad string value quoted in a message

// s cut to at most max bytes without splitting a UTF-8 sequence, "..." marking a cut.
std::string clip(std::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return std::string(s.substr(0, n)) + "...";
}

// The given value as a message shows it: short, and valid UTF-8 whatever the
// input (messages end up in JSON output, whose writer refuses bad UTF-8).
std::string describe(const json& v) {
  switch (v.type()) {
    case json::value_t::string:
      return json(clip(v.get_ref<const std::string&>(), kMaxShown))
          .dump(-1, ' ', false, json::error_handler_t::replace);
    case json::value_t::array:
      return v.empty() ? "an empty array" : "an array";
    case json::value_t::object:
      return "an object";
    default:  // null, a boolean or a number
      return v.dump();
  }
}

[[noreturn]] void fail(std::string field, const std::string& message) {
  throw RequestError(std::move(field), message);
}

[[noreturn]] void fail_type(std::string field, std::string_view expected, const json& v) {
  fail(std::move(field), fmt::format("must be {}, got {}", expected, describe(v)));
}

// The value of `key`, or null when it is absent or JSON null (both mean "the default").
const json* find(const json& obj, std::string_view key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const json& v, const std::string& field) {
  if (!v.is_boolean()) fail_type(field, "a boolean", v);
  return v.get<bool>();
}

const std::string& get_string(const json& v, const std::string& field) {
  if (!v.is_string()) fail_type(field, "a string", v);
  return v.get_ref<const std::string&>();
}

// A JSON integer in [lo, hi]. The range is checked on the stored int64 or
// uint64 before any narrowing, so 1e300 or 2^64-1 is an error, never a wrap.
// Integer fields take JSON integers only: 3.0 is refused, as OpenAI does.
int64_t get_int(const json& v, const std::string& field, int64_t lo, int64_t hi,
                std::string expected = {}) {
  if (expected.empty()) expected = fmt::format("an integer in [{}, {}]", lo, hi);
  if (!v.is_number_integer()) fail_type(field, expected, v);
  if (v.is_number_unsigned()) {  // every non-negative JSON integer lands here: check both ends
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || static_cast<int64_t>(u) < lo)
      fail_type(field, expected, v);
    return static_cast<int64_t>(u);
  }
  const int64_t i = v.get<int64_t>();
  if (i < lo || i > hi) fail_type(field, expected, v);
  return i;
}

// A JSON number (integer or not; booleans are not numbers) in [lo, hi], or
// (lo, hi] when lo_open. Checked as a double, then as the float stored, so a
// tiny positive value that rounds to 0 cannot pass an open bound.
float get_float(const json& v, const std::string& field, double lo, double hi, bool lo_open,
                const std::string& expected) {
  if (!v.is_number()) fail_type(field, expected, v);
  const double d = v.get<double>();
  const float f = static_cast<float>(d);
  const bool low = lo_open ? !(d > lo && f > lo) : !(d >= lo);
  if (low || !(d <= hi)) fail_type(field, expected, v);
  return f;
}

// The setting s of the table (settings.h) from JSON: its range, its name.
bool get_bool(const json& v, const settings::Setting& s) {
  if (!v.is_boolean()) fail_type(std::string(s.name), settings::expected_text(s), v);
  return v.get<bool>();
}
float get_float(const json& v, const settings::Setting& s) {
  return get_float(v, std::string(s.name), s.min, s.max, s.min_open, settings::expected_text(s));
}
int32_t get_int(const json& v, const settings::Setting& s, std::string_view key = {}) {
  const std::string field(key.empty() ? s.name : key);
  if (s.off != settings::kNoOff && v.is_number_integer() && v == s.off) {
    return static_cast<int32_t>(s.off);
  }
  return static_cast<int32_t>(get_int(v, field, static_cast<int64_t>(s.min),
                                      static_cast<int64_t>(s.max), settings::expected_text(s)));
}

// ---- the prompt -------------------------------------------------------------

constexpr const char* kPromptShape =
    "a string, an array of token ids (integers in [0, 2147483647]) or an array of one string";

void parse_prompt(const json& v, Request& r) {
  if (v.is_string()) {
    r.prompt = v.get<std::string>();
    return;
  }
  if (!v.is_array() || v.empty()) fail_type("prompt", kPromptShape, v);
  if (v[0].is_string()) {
    if (v.size() != 1) {
      fail("prompt", fmt::format("{} prompts in one request are not supported; send one request "
                                 "per prompt ({})",
                                 v.size(), kPromptShape));
    }
    r.prompt = v[0].get<std::string>();
    return;
  }
  if (!v[0].is_number_integer()) {
    fail("prompt", fmt::format("must be {}, got an array whose first item is {}", kPromptShape,
                               describe(v[0])));
  }
  if (v.size() > kMaxPromptIds) {
    fail("prompt", fmt::format("{} token ids, more than the limit of {}", v.size(), kMaxPromptIds));
  }
  r.prompt_ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const json& id = v[i];
    if (!id.is_number_integer()) {
      fail(fmt::format("prompt[{}]", i),
           fmt::format("must be a token id (an integer in [0, {}]), got {}{}", kInt32Max,
                       describe(id), id.is_string() ? "; several prompts are not supported" : ""));
    }
    r.prompt_ids.push_back(
        static_cast<TokenId>(get_int(id, fmt::format("prompt[{}]", i), 0, kInt32Max)));
  }
}

// "content": a string, or an array of {"type": "text", "text": ...} parts, concatenated.
std::string parse_content(const json& v, const std::string& field) {
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) fail_type(field, "a string or an array of text parts", v);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part_field = fmt::format("{}[{}]", field, i);
    const json& part = v[i];
    if (!part.is_object())
      fail_type(part_field, "an object {\"type\": \"text\", \"text\": ...}", part);
    const json* type = find(part, "type");
    if (!type) fail(part_field + ".type", "missing; content parts need \"type\": \"text\"");
    if (!type->is_string() || type->get_ref<const std::string&>() != "text") {
      fail_type(part_field + ".type", "\"text\" (the only content part type supported)", *type);
    }
    const json* part_text = find(part, "text");
    if (!part_text) fail(part_field + ".text", "missing; a text part needs a \"text\" string");
    text += get_string(*part_text, part_field + ".text");
  }
  return text;
}

void parse_messages(const json& v, Request& r) {
  if (!v.is_array() || v.empty()) {
    fail_type("messages", "a non-empty array of {\"role\", \"content\"} objects", v);
  }
  if (v.size() > kMaxMessages) {
    fail("messages", fmt::format("{} messages, more than the limit of {}", v.size(), kMaxMessages));
  }
  r.messages.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = fmt::format("messages[{}]", i);
    const json& m = v[i];
    if (!m.is_object()) fail_type(field, "an object with \"role\" and \"content\"", m);
    ChatMessage msg;
    const json* role = find(m, "role");
    if (!role) fail(field + ".role", "missing; every message needs a \"role\" string");
    msg.role = get_string(*role, field + ".role");
    if (msg.role.empty()) fail(field + ".role", "must be a non-empty string, got \"\"");
    const json* content = find(m, "content");
    if (!content) fail(field + ".content", "missing; every message needs a \"content\"");
    msg.content = parse_content(*content, field + ".content");
    if (const json* name = find(m, "name")) get_string(*name, field + ".name");  // ignored
    r.messages.push_back(std::move(msg));
  }
}

// ---- sampling ---------------------------------------------------------------

// {"15043": -100, ...}: OpenAI's ban is -100, stored as -inf so the token can
// never be drawn whatever its logit.
void parse_logit_bias(const json& v, SamplingParams& p) {
  if (!v.is_object()) {
    fail_type("logit_bias", "an object mapping token ids (\"15043\") to numbers in [-100, 100]", v);
  }
  for (const auto& [key, bias] : v.items()) {
    const std::string field = "logit_bias." + clip(key, kMaxShown);
    // A plain decimal below 2^31: digits only, no sign, no leading zero, at most 10 digits.
    bool ok = !key.empty() && key.size() <= 10 && (key.size() == 1 || key[0] != '0');
    int64_t id = 0;
    for (size_t i = 0; ok && i < key.size(); ++i) {
      ok = key[i] >= '0' && key[i] <= '9';
      id = id * 10 + (key[i] - '0');
    }
    if (!ok || id > kInt32Max) {
      fail(field, fmt::format("the key must be a token id (a decimal integer in [0, {}] without "
                              "sign or leading zeros), got {}",
                              kInt32Max, describe(json(key))));
    }
    const float b = get_float(bias, field, -100, 100, false, "a number in [-100, 100]");
    p.logit_bias.emplace_back(static_cast<TokenId>(id),
                              b == -100.0f ? -std::numeric_limits<float>::infinity() : b);
  }
}

void parse_stop(const json& v, Request& r) {
  const std::string expected =
      fmt::format("a string or an array of at most {} strings of 1 to {} bytes", kMaxStopStrings,
                  kMaxStopBytes);
  auto one = [&](const json& s, const std::string& field) {
    if (!s.is_string()) fail_type(field, expected, s);
    const std::string& text = s.get_ref<const std::string&>();
    if (text.empty() || text.size() > kMaxStopBytes) {
      fail(field, fmt::format("must be a string of 1 to {} bytes, got {} bytes", kMaxStopBytes,
                              text.size()));
    }
    r.stop.push_back(text);
  };
  if (v.is_string()) return one(v, "stop");
  if (!v.is_array()) fail_type("stop", expected, v);
  if (v.size() > kMaxStopStrings) {
    fail("stop",
         fmt::format("{} stop strings, more than the limit of {}", v.size(), kMaxStopStrings));
  }
  for (size_t i = 0; i < v.size(); ++i) one(v[i], fmt::format("stop[{}]", i));
}

// max_completion_tokens wins over max_tokens. A null counts only when neither
// has a value, so a client that writes every unset field as null still gets
// the limit it set; -1 or null alone means unlimited.
void parse_max_tokens(const json& body, Endpoint endpoint, Request& r) {
  r.max_tokens = endpoint == Endpoint::Completions ? 16 : -1;
  const std::string legacy_key(settings::kMaxTokens.name);
  const json* legacy = find(body, legacy_key);
  const json* current = find(body, "max_completion_tokens");
  if (legacy) r.max_tokens = get_int(*legacy, settings::kMaxTokens);
  if (current) r.max_tokens = get_int(*current, settings::kMaxTokens, "max_completion_tokens");
  if (!legacy && !current &&
      (body.contains(legacy_key) || body.contains("max_completion_tokens"))) {
    r.max_tokens = -1;
  }
}

void parse_logprobs(const json& body, Endpoint endpoint, Request& r) {
  if (endpoint == Endpoint::Completions) {
    if (const json* v = find(body, settings::kLogprobs.name)) {
      r.logprobs = get_int(*v, settings::kLogprobs);
    }
    return;
  }
  const std::string key(settings::kLogprobs.name);  // a boolean here
  const json* lp = find(body, key);
  const bool on = lp && get_bool(*lp, key);
  const json* top = find(body, "top_logprobs");
  int32_t n_top = 0;
  if (top) {
    const settings::Setting& s = settings::kLogprobs;  // a count here: -1 is not "none"
    n_top = static_cast<int32_t>(
        get_int(*top, "top_logprobs", static_cast<int64_t>(s.min), static_cast<int64_t>(s.max)));
    if (!on) fail("top_logprobs", "needs \"logprobs\": true");
  }
  r.logprobs = on ? n_top : -1;
}

// The sampling settings of the table (settings.h), each under its name.
void parse_sampling(const json& body, Request& r) {
  SamplingParams& p = r.sampling;
  visit_settings(p, [&](const settings::Setting& s, auto& member) {
    const json* v = find(body, s.name);
    if (!v) return;
    if constexpr (std::is_floating_point_v<std::remove_reference_t<decltype(member)>>) {
      member = get_float(*v, s);
    } else {
      member = get_int(*v, s);
    }
  });
  if (const json* v = find(body, "logit_bias")) parse_logit_bias(*v, p);
  if (const json* v = find(body, "samplers")) {
    const std::string& text = get_string(*v, "samplers");
    try {
      p.order = parse_sampler_order(text);
    } catch (const InvalidArgument& e) {
      fail("samplers", clip(e.message(), 300));
    }
  }
}

// ---- fields that would change the answer and are not supported ----------------

// An OpenAI field Encore does not implement, given a value that asks for it.
// Ignoring it would return an answer to another question, so it is an error
// that says what to do instead.
[[noreturn]] void unsupported(std::string field, std::string_view what, std::string_view todo) {
  fail(std::move(field), fmt::format("{} is not supported; {}", what, todo));
}

// tools / functions: an array; any tool at all is refused.
void check_no_tools(const json& body, const char* field, std::string_view what) {
  const json* v = find(body, field);
  if (!v) return;
  if (!v->is_array()) fail_type(field, "an array (of tool definitions)", *v);
  if (!v->empty()) {
    unsupported(field, what,
                fmt::format("leave \"{}\" out (or send an empty array) and describe the tools "
                            "in the messages if the model should know them",
                            field));
  }
}

// tool_choice / function_call: "none" or absent; "auto", "required" or an
// object naming a tool are refused.
void check_no_tool_choice(const json& body, const char* field) {
  const json* v = find(body, field);
  if (!v) return;
  if (!v->is_string() && !v->is_object()) {
    fail_type(field, "\"none\", \"auto\", \"required\" or an object naming a tool", *v);
  }
  if (v->is_string() && v->get_ref<const std::string&>() == "none") return;
  unsupported(field, fmt::format("{} (tool calling)", describe(*v)),
              fmt::format("leave \"{}\" out or set it to \"none\"", field));
}

// Chat: response_format, tools, tool_choice, functions, function_call.
// Completions: echo, suffix, best_of (after n is known).
void check_unsupported(const json& body, Endpoint endpoint, const Request& r) {
  if (endpoint == Endpoint::ChatCompletions) {
    if (const json* v = find(body, "response_format")) {
      const char* kShape = "an object {\"type\": \"text\"}";
      if (!v->is_object()) fail_type("response_format", kShape, *v);
      const json* type = find(*v, "type");
      if (!type) fail("response_format.type", "missing; the only supported one is \"text\"");
      if (!type->is_string()) fail_type("response_format.type", "a string (\"text\")", *type);
      if (type->get_ref<const std::string&>() != "text") {
        unsupported("response_format",
                    fmt::format("\"type\": {} (output constrained to a format)", describe(*type)),
                    "only {\"type\": \"text\"} is; leave response_format out and ask for the "
                    "format in the messages");
      }
    }
    check_no_tools(body, "tools", "tool calling");
    check_no_tool_choice(body, "tool_choice");
    check_no_tools(body, "functions", "function calling (the legacy form of tools)");
    check_no_tool_choice(body, "function_call");
    return;
  }
  if (const json* v = find(body, "echo"); v && get_bool(*v, "echo")) {
    unsupported("echo", "true (the prompt returned in front of the completion)",
                "leave echo out or set it to false, and put the prompt in front yourself");
  }
  if (const json* v = find(body, "suffix"); v && !get_string(*v, "suffix").empty()) {
    unsupported("suffix", "a suffix (inserting the completion before it)",
                "leave suffix out or set it to \"\" or null");
  }
  if (const json* v = find(body, "best_of")) {
    const int64_t best_of = get_int(*v, "best_of", 0, kInt32Max);
    if (best_of < r.n) {
      fail("best_of", fmt::format("{} must be >= n ({}): it counts the candidates n are "
                                  "chosen from",
                                  best_of, r.n));
    }
    if (best_of > r.n) {
      unsupported(
          "best_of",
          fmt::format("{} (more candidates than n = {}, returning the most likely)", best_of, r.n),
          "leave best_of out or set it to n; to choose yourself, ask for more samples "
          "with \"n\" and \"logprobs\"");
    }
  }
}

// ---- JSON text --------------------------------------------------------------

// Builds the JSON tree of one line (nlohmann's own builder, plus a nesting
// bound and the byte offset of every error, number overflow included).
class TreeBuilder final : public nlohmann::json_sax<json> {
 public:
  explicit TreeBuilder(json& root) : root_(root) {}

  bool null() override { return add(nullptr); }
  bool boolean(bool v) override { return add(v); }
  bool number_integer(number_integer_t v) override { return add(v); }
  bool number_unsigned(number_unsigned_t v) override { return add(v); }
  bool number_float(number_float_t v, const string_t&) override { return add(v); }
  bool string(string_t& v) override { return add(std::move(v)); }
  bool binary(binary_t& v) override { return add(json::binary(std::move(v))); }
  bool start_object(std::size_t) override { return open(json::object()); }
  bool key(string_t& k) override {
    key_ = std::move(k);
    return true;
  }
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::json::exception& ex) override {
    error_ = fmt::format("invalid JSON at byte {}: {}", position, reason(ex.what()));
    return false;
  }

  // "" when the text parsed.
  const std::string& error() const { return error_; }

 private:
  // nlohmann's message without its prefix and without the token read
  // ("last read: '...'"), which may be megabytes of arbitrary bytes.
  static std::string reason(std::string_view what) {
    if (what.starts_with("[json.exception.")) {
      const size_t end = what.find("] ");
      if (end != std::string_view::npos) what.remove_prefix(end + 2);
    }
    if (what.starts_with("parse error")) {
      const size_t colon = what.find(": ");
      if (colon != std::string_view::npos) what.remove_prefix(colon + 2);
    }
    const size_t token = what.find("; last read: ");
    if (token == std::string_view::npos) return clip(what, 200);
    std::string out(what.substr(0, token));
    // The token may itself hold "; expected ...": keep a tail only if it is
    // one of the parser's own token names.
    for (std::string_view name :
         {"string literal", "number literal", "true literal", "false literal", "null literal",
          "'['", "'{'", "']'", "'}'", "':'", "','", "end of input", "'[', '{', or a literal"}) {
      const std::string tail = fmt::format("'; expected {}", name);
      if (what.ends_with(tail)) return out + std::string(tail.substr(1));
    }
    return out;
  }

  // Places v in the current container (or as the root) and returns it.
  json* place(json v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    json& slot = top[key_];  // a repeated key keeps the last value, as nlohmann does
    slot = std::move(v);
    return &slot;
  }
  bool add(json v) { return place(std::move(v)) != nullptr; }
  bool open(json container) {
    if (stack_.size() >= kMaxDepth) {
      error_ =
          fmt::format("invalid JSON: arrays and objects nested deeper than {} levels", kMaxDepth);
      return false;
    }
    // Pointers into the tree stay valid: a container only grows while it is
    // the innermost open one, i.e. while nothing deeper is on the stack.
    stack_.push_back(place(std::move(container)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  json& root_;
  std::vector<json*> stack_;
  std::string key_;
  std::string error_;
};

// The tree of `line`, or nullopt with `error` set.
std::optional<json> parse_json(std::string_view line, std::string& error) {
  if (line.size() > kMaxLineBytes) {
    error = fmt::format("the line is {} bytes, more than the limit of {} (16 MiB)", line.size(),
                        kMaxLineBytes);
    return std::nullopt;
  }
  json root;
  TreeBuilder builder(root);
  if (json::sax_parse(line.begin(), line.end(), &builder)) return root;
  error = builder.error().empty() ? "invalid JSON" : builder.error();
  return std::nullopt;
}

std::optional<std::string> custom_id_of(const json& line) {
  const json* id = find(line, "custom_id");
  if (!id) return std::nullopt;
  return get_string(*id, "custom_id");
}

}  // namespace

std::string param_of(const Error& e) {
  const std::string& field = e.field();
  if (field.starts_with("prompt_ids")) return "prompt" + field.substr(10);
  if (field == "session") return "session_id";
  return field;
}

nlohmann::json parse_json_body(std::string_view text) {
  std::string error;
  std::optional<json> tree = parse_json(text, error);
  if (!tree) fail("", error);
  return std::move(*tree);
}

Request parse_request(const json& body, Endpoint endpoint) {
  if (!body.is_object()) {
    fail("", fmt::format("the request body must be a JSON object, got {}", describe(body)));
  }
  Request r;
  for (const char* ignored : {"model", "user"}) {
    if (const json* v = find(body, ignored)) get_string(*v, ignored);
  }
  // Not read into the Request (the server takes it from the body), but
  // checked here by the engine's rule: "" would silently mean "no session".
  if (const json* v = find(body, "session_id");
      v && !valid_session_id(get_string(*v, "session_id"))) {
    fail("session_id", fmt::format("must be {}, got {}", kSessionIdRule, describe(*v)));
  }
  if (const json* v = find(body, "stream")) r.stream = get_bool(*v, "stream");

  if (endpoint == Endpoint::Completions) {
    if (find(body, "messages")) {
      fail("messages",
           "a completion request takes \"prompt\"; \"messages\" belongs to "
           "/v1/chat/completions");
    }
    if (const json* v = find(body, "prompt")) parse_prompt(*v, r);
    // Special-token text in a text prompt is plain text unless asked for.
    if (const json* v = find(body, settings::kParseSpecial.name)) {
      r.parse_special = get_bool(*v, settings::kParseSpecial);
    }
  } else {
    if (find(body, "prompt")) {
      fail("prompt", "a chat request takes \"messages\"; \"prompt\" belongs to /v1/completions");
    }
    const json* v = find(body, "messages");
    if (!v) fail("messages", "missing; a chat request needs a non-empty \"messages\" array");
    parse_messages(*v, r);
    const settings::Setting& special = settings::kParseSpecial;
    if (const json* v = find(body, special.name); v && get_bool(*v, special)) {
      fail(std::string(special.name),
           "message content is always plain text (only the chat template's own markers are "
           "special tokens); parse_special belongs to /v1/completions");
    }
  }

  parse_max_tokens(body, endpoint, r);
  parse_logprobs(body, endpoint, r);
  parse_sampling(body, r);
  if (const json* v = find(body, settings::kSeed.name)) {
    // llama-server's -1 means "random", which is what an absent seed does here.
    const std::string expected = settings::expected_text(settings::kSeed);
    const std::string key(settings::kSeed.name);
    if (!v->is_number_integer()) fail_type(key, expected, *v);
    if (v->is_number_unsigned()) {
      r.seed = v->get<uint64_t>();
    } else if (v->get<int64_t>() >= 0) {
      r.seed = static_cast<uint64_t>(v->get<int64_t>());
    } else if (v->get<int64_t>() != settings::kSeed.off) {
      fail_type(key, expected, *v);
    }
  }
  if (const json* v = find(body, settings::kN.name)) r.n = get_int(*v, settings::kN);
  if (const json* v = find(body, "stop")) parse_stop(*v, r);
  if (const json* v = find(body, settings::kIgnoreEos.name)) {
    r.ignore_eos = get_bool(*v, settings::kIgnoreEos);
  }
  if (const json* v = find(body, settings::kNormalizeInput.name)) {
    r.normalize_input = get_bool(*v, settings::kNormalizeInput);
  }
  check_unsupported(body, endpoint, r);
  return r;
}

ServerRequest parse_server_request(const json& body, Endpoint endpoint) {
  ServerRequest out;
  out.request = parse_request(body, endpoint);
  if (const json* so = find(body, "stream_options"); so && !so->is_null()) {
    if (!so->is_object()) fail("stream_options", "must be an object");
    if (!out.request.stream) fail("stream_options", "only allowed when stream is true");
    if (const json* iu = find(*so, "include_usage")) {
      if (!iu->is_boolean()) fail("stream_options.include_usage", "must be true or false");
      out.include_usage = iu->get<bool>();
    }
  }
  if (const json* v = find(body, "session_id")) out.request.session = v->get<std::string>();
  return out;
}

BatchLine parse_batch_line(std::string_view line) {
  std::string error;
  const std::optional<json> doc = parse_json(line, error);
  if (!doc) fail("", error);
  if (!doc->is_object()) {
    fail("", fmt::format("a batch line must be a JSON object, got {}", describe(*doc)));
  }

  BatchLine out;
  out.custom_id = custom_id_of(*doc);
  const bool envelope = doc->contains("body") || doc->contains("url") || doc->contains("method");
  if (!envelope) {
    out.endpoint = find(*doc, "messages") ? Endpoint::ChatCompletions : Endpoint::Completions;
    out.request = parse_request(*doc, out.endpoint);
    return out;
  }
  if (const json* method = find(*doc, "method")) {
    if (!method->is_string() || method->get_ref<const std::string&>() != "POST") {
      fail_type("method", "\"POST\"", *method);
    }
  }
  const json* url = find(*doc, "url");
  constexpr const char* kUrls = "\"/v1/completions\" or \"/v1/chat/completions\"";
  if (!url) fail("url", fmt::format("missing; a batch envelope needs \"url\": {}", kUrls));
  if (*url == "/v1/completions") {
    out.endpoint = Endpoint::Completions;
  } else if (*url == "/v1/chat/completions") {
    out.endpoint = Endpoint::ChatCompletions;
  } else {
    fail_type("url", kUrls, *url);
  }
  const json* body = find(*doc, "body");
  if (!body) fail("body", "missing; a batch envelope needs the request object as \"body\"");
  if (!body->is_object()) fail_type("body", "a JSON object (the request)", *body);
  out.request = parse_request(*body, out.endpoint);
  return out;
}

std::optional<std::string> peek_custom_id(std::string_view line) {
  std::string error;
  const std::optional<json> doc = parse_json(line, error);
  if (!doc || !doc->is_object()) return std::nullopt;
  const json* id = find(*doc, "custom_id");
  if (!id || !id->is_string()) return std::nullopt;
  return id->get<std::string>();
}

}  // namespace encore::api
