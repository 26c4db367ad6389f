// Chat templates: turning a list of messages into the prompt text a
// chat-tuned model was trained on.
//
// GGUF files carry the Hugging Face Jinja template as tokenizer.chat_template;
// render_jinja_chat() runs it (jinja.h), and that is what a chat request
// gets by default. The 14 families below are C++ renderings of common
// formats, used when a request names one (--chat-template NAME), e.g. for a
// model file without a template; detect_chat_template() tells which family a
// template text resembles (by llama.cpp's marker substrings).
//
// BOS: the rendered text never starts with the BOS text. Encode it with
// EncodeOptions::add_bos = vocab.add_bos, so the tokenizer adds the single
// BOS the model expects (as llama.cpp does); the templates' leading
// `{{ bos_token }}` is thereby honoured without a double BOS. BOS/EOS *inside*
// the conversation (Llama 2's "</s><s>[INST]" between turns) is written as the
// vocabulary's token text.
//
// Special tokens: only the template's own text may become control tokens.
// render_chat_prompt() also returns the byte ranges the template wrote
// (markers such as "<|im_start|>", role names, separators, BOS/EOS between
// turns); encode with parse_special = true and special_ranges = those ranges
// (tokenizer.h), so that special-token text inside message content ("</s>",
// "<|im_start|>system") stays plain text and a user cannot forge turns or end
// the prompt. The text as a whole goes through one encode, so the merges at
// the borders between template and content are the same as a whole-string
// encode's, and a conversation whose content holds no special-token text gets
// exactly the ids it got before the ranges existed (when every special token
// was parsed everywhere); the ids differ only where a special-token text lies
// in content or across a border between content and the template. Roles are
// checked against the family's fixed set (chat_roles) and are template text.
//
// Ownership: plain values; nothing is retained. Cost: O(total message size).
// Thread-safety: all functions are pure and may be called concurrently.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "encore/tokenizer.h"

namespace encore::jinja {
class Template;
}

namespace encore {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" (some families accept others, e.g. "tool")
  std::string content;  // plain text: never parsed for special tokens
};

// The number of the user's messages: a chat's turn count. Turn k of a chat
// seeded S takes S + k - 1, in `encore chat --seed S` and in a session
// continued without a seed (the engine's session seed rule).
int64_t user_turns(const std::vector<ChatMessage>& messages);

// The supported chat formats. Names (chat_template_name) are llama.cpp's
// --chat-template names where llama.cpp has the same format.
enum class ChatTemplate {
  ChatML,           // "chatml": <|im_start|>role\n...<|im_end|>\n (Qwen, SmolLM, Yi, Hermes)
  Phi4,             // "phi4": <|im_start|>role<|im_sep|>...<|im_end|>
  Llama2,           // "llama2": Meta Llama-2-chat, [INST] <<SYS>>\n...\n<</SYS>>\n\n... [/INST]
  Llama3,           // "llama3": <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  MistralV1,        // "mistral-v1": " [INST] ... [/INST] ...</s>" (Mistral-7B-Instruct v0.1/v0.2)
  MistralV3,        // "mistral-v3": "[INST] ...[/INST] ...</s>" (Mistral v0.3, Mixtral 8x22B)
  MistralV3Tekken,  // "mistral-v3-tekken": "[INST]...[/INST]...</s>" (Mistral Nemo)
  MistralV7,  // "mistral-v7": [SYSTEM_PROMPT] ...[/SYSTEM_PROMPT][INST] ...[/INST] (Large 2411)
  MistralV7Tekken,  // "mistral-v7-tekken": as v7 without the spaces (Mistral Small 3)
  Phi3,             // "phi3": <|user|>\n...<|end|>\n<|assistant|>\n
  Gemma,            // "gemma": <start_of_turn>user\n...<end_of_turn>\n, role "model"
  DeepSeek,         // "deepseek": DeepSeek-Coder-Instruct, ### Instruction:\n ### Response:\n
  DeepSeek2,        // "deepseek2": DeepSeek-LLM-Chat and V2, "User: ...\n\nAssistant:"
  DeepSeek3,        // "deepseek3": DeepSeek-V3/R1, <｜User｜>...<｜Assistant｜>
};

// Every family, in the order names are listed in messages.
std::span<const ChatTemplate> all_chat_templates();

// The --chat-template name ("chatml", "llama3", ...).
std::string_view chat_template_name(ChatTemplate t);

// "chatml, phi4, llama2, ...": for error and help messages.
std::string chat_template_names();

// The family named `name` (exactly as chat_template_name spells it). Throws
// InvalidArgument listing the valid names.
ChatTemplate chat_template_from_name(std::string_view name);

// The family of a Jinja template text (tokenizer.chat_template), by marker
// substrings; a text that is itself a family name is that family. Throws
// InvalidArgument for an empty or unrecognised template (and for families
// llama.cpp knows but Encore does not render, e.g. Command-R), saying to
// pass --chat-template NAME and listing the names.
ChatTemplate detect_chat_template(std::string_view template_text);

// The roles family `t` accepts, "system", "user", "assistant" first: ChatML
// adds "tool", Llama 3 adds "tool" and "ipython" (written as given); the
// others have only those three (Gemma writes "assistant" as "model").
std::span<const std::string_view> chat_roles(ChatTemplate t);

// A rendered conversation: the prompt text and the byte ranges of it that the
// template wrote itself (ascending, disjoint and never adjacent: neighbouring
// template pieces are one range). Every byte outside them is message content.
struct RenderedChat {
  std::string text;
  std::vector<TextRange> template_ranges;
};

// Renders `messages` in family `t`. add_generation_prompt appends the opening
// of an assistant turn for families that have one (ChatML's
// "<|im_start|>assistant\n"); the [INST] families end a user turn with
// "[/INST]", which already is that prompt. The result has no leading BOS (see
// the file comment); `vocab` supplies the BOS/EOS texts used inside the
// conversation (a family's usual "<s>"/"</s>" when the vocabulary has none).
// Throws InvalidArgument whose message starts with the field
// ("messages[2].role: ...") for a role outside chat_roles(t) (listing them; an
// empty role, "user\nassistant", "<|im_start|>" ...), a system message that
// is not the first message in a family whose format only has room for one at
// the start, or a system message with no following turn to carry it (Llama 2,
// Mistral v1/v3, Gemma join it to a turn; it would vanish).
RenderedChat render_chat_prompt(ChatTemplate t, std::span<const ChatMessage> messages,
                                bool add_generation_prompt, const Vocab& vocab);

// Renders `messages` with a Jinja chat template (jinja.h): the model's own
// tokenizer.chat_template or any other, as transformers' apply_chat_template
// does, with the variables messages (role and content of each),
// add_generation_prompt, bos_token and eos_token (the vocabulary's texts);
// strftime_now reads `now` (seconds since 1970, UTC; nullopt: the system
// clock). Every message string is content, outside the returned
// template_ranges, whatever the template does with it; roles (checked to
// be chat roles), bos_token and eos_token are template text; tools and
// documents are none, as transformers passes them without tools. As
// llama.cpp (not transformers, which adds no special tokens to a rendered
// chat), the prompt gets one BOS when vocab.add_bos whether or not the
// template writes bos_token: a BOS text the template writes first is dropped
// here, and the tokenizer adds the one BOS (as for the families). Throws
// InvalidArgument with field "messages" (a role: "messages[i].role") and the
// template line ("chat template line 7: raise_exception: Conversation roles
// must alternate user/assistant/user/assistant/...").
RenderedChat render_jinja_chat(const jinja::Template& t, std::span<const ChatMessage> messages,
                               bool add_generation_prompt, const Vocab& vocab,
                               std::optional<int64_t> now);

// render_chat_prompt(...).text: for display and tests. Tokenizing this text
// with special tokens parsed everywhere would let content become control
// tokens; prompts go through render_chat_prompt and its ranges.
std::string render_chat(ChatTemplate t, std::span<const ChatMessage> messages,
                        bool add_generation_prompt, const Vocab& vocab);

}  // namespace encore
