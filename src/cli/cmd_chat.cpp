// `encore chat`: a multi-turn conversation in the terminal through the
// model's chat template, streaming each answer. Every turn sends the whole
// conversation; the engine's prefix cache (and, with --session, the state
// tiers) supplies the KV of the turns before, so only the new text is
// evaluated. Commands: /save [NAME], /reset, /exit (or end of input);
// Ctrl-C stops the current answer (and, at the prompt, exits). Typed lines
// are user messages, plain text like all message content: "</s>" or
// "<|im_start|>" typed here are those letters, never control tokens
// (chat_template.h).
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "cli/setting_flags.h"
#include "encore/engine.h"
#include "encore/error.h"

namespace encore::cli {
namespace {

struct ChatArgs {
  std::string model;
  std::string session;
  std::string system;
  std::string chat_template;
  Request request;  // the table's settings (--temp, -n, --seed ...: settings.h)
  EngineFlags engine;
};

// Set by SIGINT. A signal handler can only talk through such a flag: the one
// piece of process-wide state, and it belongs to this command's loop.
std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

std::vector<ChatMessage> fresh_conversation(const ChatArgs& a) {
  std::vector<ChatMessage> m;
  if (!a.system.empty()) m.push_back({"system", a.system});
  return m;
}

// The conversation a chat starts with: the session's saved one, or a fresh
// one (the system prompt, if any).
std::vector<ChatMessage> starting_conversation(Engine& engine, const ChatArgs& a) {
  std::vector<ChatMessage> messages = fresh_conversation(a);
  if (a.session.empty()) return messages;
  std::string absent;
  const std::optional<RunState> saved = engine.load_session("", a.session, &absent);
  if (saved && !saved->request.messages.empty()) {
    messages = saved->request.messages;
    fmt::print(stderr, "chat: session {} continued ({} messages)\n", a.session, messages.size());
  } else if (saved) {
    fmt::print(stderr, "chat: session {} started (the saved one is not a chat)\n", a.session);
  } else {
    fmt::print(stderr, "chat: session {} started ({})\n", a.session, absent);
  }
  return messages;
}

// The request of the next turn.
Request turn_request(const ChatArgs& a, const std::vector<ChatMessage>& messages) {
  Request r;
  r.messages = messages;
  r.chat_template = a.chat_template;
  r.sampling = a.request.sampling;
  // One seed per turn of the conversation (a continued one goes on counting).
  if (a.request.seed) r.seed = *a.request.seed + static_cast<uint64_t>(user_turns(messages) - 1);
  r.max_tokens = a.request.max_tokens;
  r.stream = true;
  r.session = a.session;
  return r;
}

// Prints the answer as it comes, until it ends or Ctrl-C cancels it.
const Response& print_answer(RequestHandle& h) {
  for (;;) {  // polled, so that Ctrl-C also stops a long prompt evaluation
    const std::optional<Event> e = h.next_for(std::chrono::milliseconds(100));
    if (g_interrupted) h.cancel();
    if (!e) {
      if (h.done()) break;
      continue;
    }
    if (e->kind == Event::Kind::Done) break;
    fmt::print("{}", e->text);
    std::fflush(stdout);
  }
  return h.wait();
}

void run_chat(const ChatArgs& a) {
  const std::unique_ptr<Engine> engine =
      Engine::open(engine_options(a.model, a.engine, !a.session.empty()));
  const EngineInfo& info = engine->info();
  const bool tty = isatty(STDIN_FILENO) != 0;

  std::vector<ChatMessage> messages = starting_conversation(*engine, a);
  if (info.synthetic) fmt::print(stderr, "note: random weights: the answers are noise\n");
  if (tty) fmt::print(stderr, "commands: /save [NAME], /reset, /exit; Ctrl-C stops an answer\n");

  struct sigaction sa {};
  sa.sa_handler = on_sigint;  // no SA_RESTART: a read at the prompt returns
  sigaction(SIGINT, &sa, nullptr);

  std::optional<Response> last;
  std::optional<Request> last_request;
  int turn = 0;  // turns in this process
  for (;;) {
    if (tty) {
      fmt::print("> ");
      std::fflush(stdout);
    }
    std::string line;
    g_interrupted = false;
    if (!std::getline(std::cin, line)) break;  // end of input, or Ctrl-C at the prompt
    if (line == "/exit") break;
    if (line == "/reset") {
      messages = fresh_conversation(a);
      last.reset();  // /save has nothing to save until the next answer
      last_request.reset();
      fmt::print(stderr, "(conversation reset)\n");
      continue;
    }
    if (line == "/save" || line.rfind("/save ", 0) == 0) {
      const std::string name = line.size() > 6 ? line.substr(6) : a.session;
      if (name.empty() || !last) {
        fmt::print(stderr, "(nothing to save{})\n",
                   name.empty() ? ": give a name, /save NAME" : "");
        continue;
      }
      try {
        Request kept = *last_request;
        kept.messages = messages;
        engine->save_session("", name,
                             run_state_after(kept, *last, info.system_fingerprint, info.n_ctx));
        engine->drain();
        fmt::print(stderr, "(saved as session {})\n", name);
      } catch (const Error& e) {
        fmt::print(stderr, "(not saved: {})\n", e.what());
      }
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({"user", line});
    const Request r = turn_request(a, messages);
    RequestHandle h = engine->submit(r);
    const Response& resp = print_answer(h);
    if (resp.status == Response::Status::Failed) throw ModelError(resp.error);
    fmt::print("\n");
    std::fflush(stdout);
    messages.push_back({"assistant", resp.samples[0].text});
    if (resp.status == Response::Status::Cancelled) {
      fmt::print(stderr, "(stopped)\n");
      if (!a.session.empty()) {  // the engine saves only finished turns: keep this one too
        Request kept = r;
        kept.messages = messages;
        engine->save_session("", a.session,
                             run_state_after(kept, resp, info.system_fingerprint, info.n_ctx));
      }
    }
    fmt::print(stderr, "(turn {}: {} prompt tokens, {} from cache, {} generated, seed {})\n",
               turn + 1, resp.usage.prompt_tokens, resp.usage.cached_tokens,
               resp.usage.generated_tokens, resp.seed);
    last = resp;
    last_request = r;
    ++turn;
  }
  signal(SIGINT, SIG_DFL);
  engine->drain();
}

}  // namespace

void add_chat_command(CLI::App& app) {
  auto args = std::make_shared<ChatArgs>();
  CLI::App* sub = app.add_subcommand(
      "chat",
      "Chat in the terminal through the model's chat template (multi-turn); the k-th answer of "
      "a conversation uses --seed + k - 1");
  sub->add_option("-m,--model", args->model, "Model .gguf")->required();
  sub->add_option("--session", args->session,
                  "Continue (and keep saving) the conversation NAME across processes")
      ->type_name("NAME");
  sub->add_option("--system", args->system, "System message of a new conversation");
  sub->add_option("--chat-template", args->chat_template,
                  "Chat template family instead of the model's: " + chat_template_names())
      ->type_name("NAME");
  // The request's settings (settings.h). --seed is the seed of the
  // conversation's first answer; its k-th answer uses seed + k - 1, also in
  // a continued session.
  add_setting_flags(sub, args->request, settings::kChat);
  add_engine_flags(sub, args->engine, kComputeFlags | kStateFlags | kChatFlags, settings::kChat);
  exclude_template_flags(sub);
  sub->callback([args] { run_chat(*args); });
}

}  // namespace encore::cli
