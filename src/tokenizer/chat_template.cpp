// Chat template detection (marker substrings, llama.cpp's order) and
// rendering per family.
//
// The renderers follow each family's official Hugging Face template. Where
// llama.cpp's built-in renderer (llama-chat.cpp) differs, the official
// template wins and the comment says so. What no family here does: inject the
// default system prompt some templates add when none is given (Qwen2's "You
// are a helpful assistant.", DeepSeek-Coder's), or the date lines of the
// Llama 3.1 template; pass a system message to get them. Jinja's `trim` is
// Python's str.strip(); here only ASCII whitespace is stripped.
#include "encore/chat_template.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>

#include "encore/error.h"
#include "encore/jinja.h"
#include "util/text.h"

namespace encore {
namespace {

struct NamedTemplate {
  ChatTemplate t;
  std::string_view name;
};

constexpr std::array<NamedTemplate, 14> kTemplates = {{
    {ChatTemplate::ChatML, "chatml"},
    {ChatTemplate::Phi4, "phi4"},
    {ChatTemplate::Llama2, "llama2"},
    {ChatTemplate::Llama3, "llama3"},
    {ChatTemplate::MistralV1, "mistral-v1"},
    {ChatTemplate::MistralV3, "mistral-v3"},
    {ChatTemplate::MistralV3Tekken, "mistral-v3-tekken"},
    {ChatTemplate::MistralV7, "mistral-v7"},
    {ChatTemplate::MistralV7Tekken, "mistral-v7-tekken"},
    {ChatTemplate::Phi3, "phi3"},
    {ChatTemplate::Gemma, "gemma"},
    {ChatTemplate::DeepSeek, "deepseek"},
    {ChatTemplate::DeepSeek2, "deepseek2"},
    {ChatTemplate::DeepSeek3, "deepseek3"},
}};

constexpr std::array<ChatTemplate, kTemplates.size()> kAll = [] {
  std::array<ChatTemplate, kTemplates.size()> a{};
  for (size_t i = 0; i < kTemplates.size(); ++i) a[i] = kTemplates[i].t;
  return a;
}();

// DeepSeek's special tokens are spelled with U+FF5C FULLWIDTH VERTICAL LINE
// (EF BD 9C) and U+2581 LOWER ONE EIGHTH BLOCK (E2 96 81). The literals are
// split after each escape so that a following hex letter does not extend it.
constexpr std::string_view kDsUser = "<\xEF\xBD\x9CUser\xEF\xBD\x9C>";
constexpr std::string_view kDsAssistant =
    "<\xEF\xBD\x9C"
    "Assistant\xEF\xBD\x9C>";
constexpr std::string_view kDsEndOfSentence =
    "<\xEF\xBD\x9C"
    "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>";
// MiniCPM's "<用户>" (a family Encore recognises but does not render).
constexpr std::string_view kMiniCpmUser = "<\xE7\x94\xA8\xE6\x88\xB7>";

bool is_ascii_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_ascii_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ascii_space(s.back())) s.remove_suffix(1);
  return s;
}

// The text of a vocabulary's special token, or the family's usual spelling
// when the vocabulary has none (hand-built vocabularies, --chat-template on a
// model of another family).
std::string_view token_text(const Vocab& v, TokenId id, std::string_view fallback) {
  if (id >= 0 && id < v.n_vocab()) return v.tokens[static_cast<size_t>(id)];
  return fallback;
}

// Result of matching a template text: a supported family, or the name of a
// family llama.cpp knows that Encore does not render.
struct Detected {
  std::optional<ChatTemplate> t;
  std::string_view unsupported;
};

// The markers and their order are llama.cpp's (llm_chat_detect_template):
// earlier checks shadow later ones, so families Encore does not render are
// still checked in their place, lest their templates fall through to a
// family whose marker they happen to contain (SmolVLM uses <|im_start|> but is
// not ChatML).
Detected detect(std::string_view tmpl) {
  const auto has = [tmpl](std::string_view marker) {
    return tmpl.find(marker) != std::string_view::npos;
  };
  if (has("<|im_start|>")) {
    if (has("<|im_sep|>")) return {ChatTemplate::Phi4, {}};
    if (has("<end_of_utterance>")) return {std::nullopt, "SmolVLM"};
    return {ChatTemplate::ChatML, {}};
  }
  if (tmpl.starts_with("mistral") || has("[INST]")) {
    // v7 writes "[SYSTEM_PROMPT] " with a space, v7-tekken (Mistral Small 3)
    // without. (llama.cpp takes both for v7.)
    if (has("[SYSTEM_PROMPT]")) {
      return {has("[SYSTEM_PROMPT] ") ? ChatTemplate::MistralV7 : ChatTemplate::MistralV7Tekken,
              {}};
    }
    // Mistral's official v1 template (system message glued to the first
    // [INST]) and the v3 ones (tool support).
    if (has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]")) {
      if (has(" [INST]")) return {ChatTemplate::MistralV1, {}};
      if (has("\"[INST]\"")) return {ChatTemplate::MistralV3Tekken, {}};
      return {ChatTemplate::MistralV3, {}};
    }
    // Meta's Llama 2 chat, CodeLlama-Instruct and the early Mistral/Mixtral
    // templates (which had no system role). The last differ from Llama 2 only
    // in the spacing of earlier assistant turns; single-turn prompts render
    // the same.
    return {ChatTemplate::Llama2, {}};
  }
  if (has("<|assistant|>") && has("<|end|>")) return {ChatTemplate::Phi3, {}};
  if (has("[gMASK]<sop>")) return {std::nullopt, "ChatGLM4"};
  if (has("<|assistant|>") && has("<|user|>")) return {std::nullopt, "Falcon3 or GLM-Edge"};
  if (has("<|user|>") && has("<|endoftext|>")) return {std::nullopt, "Zephyr"};
  if (has("bos_token + message['role']")) return {std::nullopt, "Monarch"};
  if (has("<start_of_turn>")) return {ChatTemplate::Gemma, {}};
  if (has("'\\n\\nAssistant: ' + eos_token")) return {std::nullopt, "Orion"};
  if (has("GPT4 Correct ")) return {std::nullopt, "OpenChat"};
  if (has("USER: ") && has("ASSISTANT: ")) return {std::nullopt, "Vicuna"};
  if (has("### Instruction:") && has("<|EOT|>")) return {ChatTemplate::DeepSeek, {}};
  if (has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>")) return {std::nullopt, "Command-R"};
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return {ChatTemplate::Llama3, {}};
  if (has("[gMASK]sop")) return {std::nullopt, "ChatGLM3"};
  if (has(kMiniCpmUser)) return {std::nullopt, "MiniCPM"};
  if (has("'Assistant: ' + message['content'] + eos_token")) return {ChatTemplate::DeepSeek2, {}};
  if (has(kDsAssistant) && has(kDsUser) && has(kDsEndOfSentence)) {
    return {ChatTemplate::DeepSeek3, {}};
  }
  if (has("[|system|]") && has("[|assistant|]") && has("[|endofturn|]")) {
    return {std::nullopt, "EXAONE"};
  }
  if (has("<|start_of_role|>")) return {std::nullopt, "Granite"};
  if (has("<|header_start|>") && has("<|header_end|>")) return {std::nullopt, "Llama 4"};
  return {};
}

// ---------------------------------------------------------------------------
// The prompt being written: its text and which bytes of it the template wrote
// (RenderedChat). Renderers write template text with tmpl() and message text
// with content(); neighbouring template pieces merge into one range, so a
// special-token text the template spells in pieces ("<|" + role + "|>") lies
// inside one range.

class Prompt {
 public:
  Prompt& tmpl(std::string_view s) {
    if (s.empty()) return *this;
    const size_t at = r_.text.size();
    r_.text += s;
    if (!r_.template_ranges.empty() && r_.template_ranges.back().end == at) {
      r_.template_ranges.back().end = r_.text.size();
    } else {
      r_.template_ranges.push_back({at, r_.text.size()});
    }
    return *this;
  }
  Prompt& content(std::string_view s) {
    r_.text += s;
    return *this;
  }
  // Appends `p`, its ranges moved along.
  Prompt& append(const Prompt& p) {
    const std::string_view t = p.r_.text;
    size_t at = 0;
    for (const TextRange& r : p.r_.template_ranges) {
      content(t.substr(at, r.begin - at));
      tmpl(t.substr(r.begin, r.end - r.begin));
      at = r.end;
    }
    return content(t.substr(at));
  }
  // Without the ASCII whitespace at both ends (Jinja's trim of a whole turn).
  Prompt trimmed() const {
    const std::string_view all = r_.text;
    const std::string_view kept = trim(all);
    const size_t lo = static_cast<size_t>(kept.data() - all.data()), hi = lo + kept.size();
    Prompt out;
    size_t at = lo;
    for (const TextRange& r : r_.template_ranges) {
      const size_t b = std::clamp(r.begin, lo, hi), e = std::clamp(r.end, lo, hi);
      out.content(all.substr(at, b - at));
      out.tmpl(all.substr(b, e - b));
      at = e;
    }
    out.content(all.substr(at, hi - at));
    return out;
  }
  bool empty() const { return r_.text.empty(); }
  RenderedChat take() { return std::move(r_); }

 private:
  RenderedChat r_;
};

// ---------------------------------------------------------------------------
// Message checks shared by the renderers.

constexpr std::string_view kBasicRoles[] = {"system", "user", "assistant"};
constexpr std::string_view kChatMlRoles[] = {"system", "user", "assistant", "tool"};
constexpr std::string_view kLlama3Roles[] = {"system", "user", "assistant", "tool", "ipython"};

std::string role_list(ChatTemplate t) {
  std::string s;
  for (std::string_view r : chat_roles(t)) {
    if (!s.empty()) s += ", ";
    s += r;
  }
  return s;
}

// The roles a Jinja template may get: OpenAI's and Llama 3's. Checked, they
// are template text (render_jinja_chat).
constexpr std::array<std::string_view, 7> kJinjaRoles = {
    "system", "developer", "user", "assistant", "tool", "ipython", "function"};

// Every role is one of the family's (chat_roles): the role is template text
// and may spell special tokens ("<|user|>"), so nothing else may get in.
void check_messages(ChatTemplate t, std::span<const ChatMessage> msgs, bool system_only_first) {
  const std::span<const std::string_view> roles = chat_roles(t);
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string& role = msgs[i].role;
    if (std::find(roles.begin(), roles.end(), role) == roles.end()) {
      throw InvalidArgument(
          fmt::format("messages[{}].role", i),
          fmt::format("'{}' is not a role of the {} chat format (accepted: {})",
                      util::printable(role, 40), chat_template_name(t), role_list(t)));
    }
    if (system_only_first && role == "system" && i != 0) {
      throw InvalidArgument(
          fmt::format("messages[{}].role", i),
          fmt::format("a system message, but the {} format takes one only as the first message",
                      chat_template_name(t)));
    }
  }
}

// The messages after an optional leading system message, and its text.
struct SplitSystem {
  std::optional<std::string_view> system;
  std::span<const ChatMessage> rest;
};
// For formats that join the system text to a later turn: a system message
// with no turn to carry it would silently vanish, so it is an error.
SplitSystem split_system(ChatTemplate t, std::span<const ChatMessage> msgs,
                         std::string_view carrier) {
  if (msgs.empty() || msgs.front().role != "system") return {std::nullopt, msgs};
  const auto rest = msgs.subspan(1);
  bool carried = false;
  for (const ChatMessage& m : rest) carried = carried || carrier.empty() || m.role == carrier;
  if (!carried) {
    throw InvalidArgument(
        fmt::format("the {} format puts the system message into a {} turn, but there is none",
                    chat_template_name(t), carrier.empty() ? "following" : carrier));
  }
  return {std::string_view(msgs.front().content), rest};
}

// ---------------------------------------------------------------------------
// Renderers, one per family (or group of close variants). Role names are
// template text (check_messages allows only the family's own).

void render_chatml(std::span<const ChatMessage> msgs, bool gen, Prompt& out) {
  for (const ChatMessage& m : msgs) {
    out.tmpl("<|im_start|>").tmpl(m.role).tmpl("\n").content(m.content).tmpl("<|im_end|>\n");
  }
  if (gen) out.tmpl("<|im_start|>assistant\n");
}

void render_phi4(std::span<const ChatMessage> msgs, bool gen, Prompt& out) {
  for (const ChatMessage& m : msgs) {
    out.tmpl("<|im_start|>").tmpl(m.role).tmpl("<|im_sep|>").content(m.content).tmpl("<|im_end|>");
  }
  if (gen) out.tmpl("<|im_start|>assistant<|im_sep|>");
}

// Meta's template: the system message is wrapped in <<SYS>> and joined to the
// first turn, every user turn is "<s>[INST] ... [/INST]" and every answer
// " ... </s>", contents stripped. (llama.cpp's "llama2-sys-strip" renders
// "[/INST]answer</s>[INST]" instead: no spaces, no BOS between turns.)
void render_llama2(std::span<const ChatMessage> msgs, const Vocab& v, Prompt& out) {
  const std::string_view bos = token_text(v, v.bos, "<s>");
  const std::string_view eos = token_text(v, v.eos, "</s>");
  const SplitSystem s = split_system(ChatTemplate::Llama2, msgs, "");
  for (size_t i = 0; i < s.rest.size(); ++i) {
    const ChatMessage& m = s.rest[i];
    Prompt content;
    if (i == 0 && s.system) content.tmpl("<<SYS>>\n").content(*s.system).tmpl("\n<</SYS>>\n\n");
    content.content(m.content);
    if (m.role == "user") {
      // The first BOS is the tokenizer's (see chat_template.h).
      if (!out.empty()) out.tmpl(bos);
      out.tmpl("[INST] ").append(content.trimmed()).tmpl(" [/INST]");
    } else {
      out.tmpl(" ").append(content.trimmed()).tmpl(" ").tmpl(eos);
    }
  }
}

void render_llama3(std::span<const ChatMessage> msgs, bool gen, Prompt& out) {
  for (const ChatMessage& m : msgs) {
    out.tmpl("<|start_header_id|>").tmpl(m.role).tmpl("<|end_header_id|>\n\n");
    out.content(trim(m.content)).tmpl("<|eot_id|>");
  }
  if (gen) out.tmpl("<|start_header_id|>assistant<|end_header_id|>\n\n");
}

// Mistral's official v1/v3 templates (mistral-common's tokenization, see
// github.com/mistralai/cookbook concept-deep-dive/tokenization). v1 joins the
// system message to the first user turn; v3 and v3-tekken join it to the
// last one. (llama.cpp joins it to the first in all three; single-turn
// prompts are the same.)
void render_mistral_v1_v3(ChatTemplate t, std::span<const ChatMessage> msgs, const Vocab& v,
                          Prompt& out) {
  const bool v1 = t == ChatTemplate::MistralV1;
  const bool tekken = t == ChatTemplate::MistralV3Tekken;
  const std::string_view eos = token_text(v, v.eos, "</s>");
  const SplitSystem s = split_system(t, msgs, "user");
  size_t system_turn = s.rest.size();  // the user message that carries the system text
  for (size_t i = 0; i < s.rest.size(); ++i) {
    if (s.rest[i].role != "user") continue;
    system_turn = i;
    if (v1) break;  // first user turn; otherwise keep the last
  }
  for (size_t i = 0; i < s.rest.size(); ++i) {
    const ChatMessage& m = s.rest[i];
    if (m.role == "user") {
      out.tmpl(v1 ? " [INST] " : tekken ? "[INST]" : "[INST] ");
      if (s.system && i == system_turn) out.content(*s.system).tmpl("\n\n");
      out.content(m.content).tmpl(v1 ? " [/INST]" : "[/INST]");
    } else {
      if (!tekken) out.tmpl(" ");
      out.content(t == ChatTemplate::MistralV3 ? trim(m.content) : std::string_view(m.content));
      out.tmpl(eos);
    }
  }
}

// Mistral's v7 template (Mistral-Large-2411; tekken: Mistral-Small-3): system
// messages stay where they are.
void render_mistral_v7(ChatTemplate t, std::span<const ChatMessage> msgs, const Vocab& v,
                       Prompt& out) {
  const std::string_view sp = t == ChatTemplate::MistralV7 ? " " : "";
  const std::string_view eos = token_text(v, v.eos, "</s>");
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") {
      out.tmpl("[SYSTEM_PROMPT]").tmpl(sp).content(m.content).tmpl("[/SYSTEM_PROMPT]");
    } else if (m.role == "user") {
      out.tmpl("[INST]").tmpl(sp).content(m.content).tmpl("[/INST]");
    } else {
      out.tmpl(sp).content(m.content).tmpl(eos);
    }
  }
}

// Phi-3.5/Phi-3 (later revisions, which have a system role; the first
// Phi-3-mini template dropped system messages and opened the assistant turn
// right after each user turn, which renders the same for user/assistant
// conversations ending in a generation prompt).
void render_phi3(std::span<const ChatMessage> msgs, bool gen, Prompt& out) {
  for (const ChatMessage& m : msgs) {
    out.tmpl("<|").tmpl(m.role).tmpl("|>\n").content(m.content).tmpl("<|end|>\n");
  }
  if (gen) out.tmpl("<|assistant|>\n");
}

// Gemma 2/3: no system role; the system text and a blank line open the first
// turn (Gemma 3's template; Gemma 1/2 raise an error instead). "assistant" is
// "model"; contents are trimmed.
void render_gemma(std::span<const ChatMessage> msgs, bool gen, Prompt& out) {
  const SplitSystem s = split_system(ChatTemplate::Gemma, msgs, "");
  for (size_t i = 0; i < s.rest.size(); ++i) {
    const ChatMessage& m = s.rest[i];
    out.tmpl("<start_of_turn>");
    out.tmpl(m.role == "assistant" ? std::string_view("model") : std::string_view(m.role));
    out.tmpl("\n");
    if (i == 0 && s.system) out.content(*s.system).tmpl("\n\n");
    out.content(trim(m.content)).tmpl("<end_of_turn>\n");
  }
  if (gen) out.tmpl("<start_of_turn>model\n");
}

// DeepSeek-Coder-Instruct. (Its template ends in "{{'### Response:'}}" and a
// line break, which Hugging Face's Jinja settings keep: "### Response:\n".)
void render_deepseek(std::span<const ChatMessage> msgs, bool gen, Prompt& out) {
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") {
      out.content(m.content);
    } else if (m.role == "user") {
      out.tmpl("### Instruction:\n").content(m.content).tmpl("\n");
    } else {
      out.tmpl("### Response:\n").content(m.content).tmpl("\n<|EOT|>\n");
    }
  }
  if (gen) out.tmpl("### Response:\n");
}

// DeepSeek-LLM-Chat and DeepSeek-V2.
void render_deepseek2(std::span<const ChatMessage> msgs, bool gen, const Vocab& v, Prompt& out) {
  const std::string_view eos = token_text(v, v.eos, kDsEndOfSentence);
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") {
      out.content(m.content).tmpl("\n\n");
    } else if (m.role == "user") {
      out.tmpl("User: ").content(m.content).tmpl("\n\n");
    } else {
      out.tmpl("Assistant: ").content(m.content).tmpl(eos);
    }
  }
  if (gen) out.tmpl("Assistant:");
}

// DeepSeek-V3/R1: all system messages go first, joined by blank lines, with
// nothing between them and the first <｜User｜> (official template; llama.cpp
// writes each in place followed by "\n\n").
void render_deepseek3(std::span<const ChatMessage> msgs, bool gen, Prompt& out) {
  bool first_system = true;
  for (const ChatMessage& m : msgs) {
    if (m.role != "system") continue;
    if (!first_system) out.tmpl("\n\n");
    out.content(m.content);
    first_system = false;
  }
  for (const ChatMessage& m : msgs) {
    if (m.role == "user") {
      out.tmpl(kDsUser).content(m.content);
    } else if (m.role == "assistant") {
      out.tmpl(kDsAssistant).content(m.content).tmpl(kDsEndOfSentence);
    }
  }
  if (gen) out.tmpl(kDsAssistant);
}

}  // namespace

std::span<const ChatTemplate> all_chat_templates() { return kAll; }

int64_t user_turns(const std::vector<ChatMessage>& messages) {
  return std::count_if(messages.begin(), messages.end(),
                       [](const ChatMessage& m) { return m.role == "user"; });
}

std::string_view chat_template_name(ChatTemplate t) {
  for (const NamedTemplate& e : kTemplates) {
    if (e.t == t) return e.name;
  }
  return "unknown";
}

std::string chat_template_names() {
  std::string s;
  for (const NamedTemplate& e : kTemplates) {
    if (!s.empty()) s += ", ";
    s += e.name;
  }
  return s;
}

ChatTemplate chat_template_from_name(std::string_view name) {
  for (const NamedTemplate& e : kTemplates) {
    if (e.name == name) return e.t;
  }
  throw InvalidArgument("chat_template", fmt::format("unknown chat template name '{}' (known: {})",
                                                     name, chat_template_names()));
}

ChatTemplate detect_chat_template(std::string_view template_text) {
  for (const NamedTemplate& e : kTemplates) {
    if (e.name == template_text) return e.t;
  }
  if (trim(template_text).empty()) {
    throw InvalidArgument(
        fmt::format("the chat template is empty: pass --chat-template NAME (one of: {})",
                    chat_template_names()));
  }
  const Detected d = detect(template_text);
  if (d.t) return *d.t;
  if (!d.unsupported.empty()) {
    throw InvalidArgument(fmt::format(
        "the chat template looks like {}'s, which Encore does not render: pass --chat-template "
        "NAME with the closest of: {}",
        d.unsupported, chat_template_names()));
  }
  // Show where the template starts so the user can tell which model it is.
  std::string head(template_text.substr(0, 60));
  for (char& c : head) {
    if (static_cast<unsigned char>(c) < 0x20) c = ' ';
  }
  throw InvalidArgument(fmt::format(
      "unrecognised chat template (it starts \"{}{}\"): pass --chat-template NAME (one of: {})",
      head, template_text.size() > 60 ? "..." : "", chat_template_names()));
}

std::span<const std::string_view> chat_roles(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::ChatML:
      return kChatMlRoles;
    case ChatTemplate::Llama3:
      return kLlama3Roles;
    default:
      return kBasicRoles;
  }
}

RenderedChat render_chat_prompt(ChatTemplate t, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, const Vocab& vocab) {
  Prompt out;
  switch (t) {
    case ChatTemplate::ChatML:
      check_messages(t, messages, false);
      render_chatml(messages, add_generation_prompt, out);
      break;
    case ChatTemplate::Phi4:
      check_messages(t, messages, false);
      render_phi4(messages, add_generation_prompt, out);
      break;
    case ChatTemplate::Llama2:
      check_messages(t, messages, true);
      render_llama2(messages, vocab, out);
      break;
    case ChatTemplate::Llama3:
      check_messages(t, messages, false);
      render_llama3(messages, add_generation_prompt, out);
      break;
    case ChatTemplate::MistralV1:
    case ChatTemplate::MistralV3:
    case ChatTemplate::MistralV3Tekken:
      check_messages(t, messages, true);
      render_mistral_v1_v3(t, messages, vocab, out);
      break;
    case ChatTemplate::MistralV7:
    case ChatTemplate::MistralV7Tekken:
      check_messages(t, messages, false);
      render_mistral_v7(t, messages, vocab, out);
      break;
    case ChatTemplate::Phi3:
      check_messages(t, messages, false);
      render_phi3(messages, add_generation_prompt, out);
      break;
    case ChatTemplate::Gemma:
      check_messages(t, messages, true);
      render_gemma(messages, add_generation_prompt, out);
      break;
    case ChatTemplate::DeepSeek:
      check_messages(t, messages, false);
      render_deepseek(messages, add_generation_prompt, out);
      break;
    case ChatTemplate::DeepSeek2:
      check_messages(t, messages, false);
      render_deepseek2(messages, add_generation_prompt, vocab, out);
      break;
    case ChatTemplate::DeepSeek3:
      check_messages(t, messages, false);
      render_deepseek3(messages, add_generation_prompt, out);
      break;
  }
  return out.take();
}

std::string render_chat(ChatTemplate t, std::span<const ChatMessage> messages,
                        bool add_generation_prompt, const Vocab& vocab) {
  return render_chat_prompt(t, messages, add_generation_prompt, vocab).text;
}

RenderedChat render_jinja_chat(const jinja::Template& t, std::span<const ChatMessage> messages,
                               bool add_generation_prompt, const Vocab& vocab,
                               std::optional<int64_t> now) {
  nlohmann::ordered_json context;
  context["messages"] = nlohmann::ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (std::find(kJinjaRoles.begin(), kJinjaRoles.end(), m.role) == kJinjaRoles.end()) {
      throw InvalidArgument(fmt::format("messages[{}].role", i),
                            fmt::format("'{}' is not a chat role (one of: {})",
                                        util::printable(m.role, 40), fmt::join(kJinjaRoles, ", ")));
    }
    context["messages"].push_back({{"role", m.role}, {"content", m.content}});
  }
  context["add_generation_prompt"] = add_generation_prompt;
  auto token_text = [&](TokenId id) {
    return id >= 0 && static_cast<size_t>(id) < vocab.tokens.size() ? vocab.tokens[id]
                                                                    : std::string();
  };
  const std::string bos = token_text(vocab.bos);
  // What transformers' apply_chat_template passes besides: tools and
  // documents (none: tool calling is not served), the special tokens.
  context["tools"] = nullptr;
  context["documents"] = nullptr;
  context["bos_token"] = bos;
  context["eos_token"] = token_text(vocab.eos);
  if (vocab.unk >= 0) context["unk_token"] = token_text(vocab.unk);
  if (vocab.pad >= 0) context["pad_token"] = token_text(vocab.pad);
  // bos_token, eos_token and the roles (checked above) are template text: a
  // template may build markers from a role ('<|' + role + '|>').
  jinja::RenderOptions opt;
  opt.trusted_paths.push_back("/messages/*/role");
  opt.now_unix_seconds = now ? *now
                             : std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
  jinja::Rendered r;
  try {
    r = t.render(context, opt);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("messages", e.what());
  }
  RenderedChat out;
  size_t skip = 0;
  // The BOS the template wrote is the one BOS the tokenizer adds (add_bos),
  // as for the families: the text never starts with it (file comment).
  if (vocab.add_bos && !bos.empty() && r.text.compare(0, bos.size(), bos) == 0 &&
      !r.template_ranges.empty() && r.template_ranges[0].begin == 0 &&
      r.template_ranges[0].end >= bos.size()) {
    skip = bos.size();
  }
  out.text = r.text.substr(skip);
  for (const jinja::ByteRange& range : r.template_ranges) {
    if (range.end <= skip) continue;
    out.template_ranges.push_back({std::max(range.begin, skip) - skip, range.end - skip});
  }
  return out;
}

}  // namespace encore
