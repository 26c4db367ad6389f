// `encore template`: renders a Jinja chat template with a JSON context and
// prints the text and nothing else, so a prompt can be checked by eye and
// compared with python3-jinja2 byte for byte (tests/jinja/). The template is
// a file (--file) or a model's tokenizer.chat_template (-m); the context is a
// JSON object of the template's variables (messages, tools,
// add_generation_prompt, bos_token ...). With -m, bos_token and eos_token
// default to the model's. --now fixes strftime_now's clock.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/jinja.h"
#include "encore/tokenizer.h"

namespace encore::cli {
namespace {

struct TemplateArgs {
  std::string file;
  std::string model;
  std::string context;
  std::string now;
  bool ranges = false;
};

std::string read_text(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(fmt::format("{}: cannot open {}", what, path));
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void run_template(const TemplateArgs& a) {
  if (a.file.empty() == a.model.empty()) {
    throw InvalidArgument("give the template as --file TEMPLATE.jinja or -m MODEL.gguf");
  }
  nlohmann::ordered_json context;
  try {
    context = nlohmann::ordered_json::parse(read_text(a.context, "--context"));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("context", fmt::format("{}: not JSON: {}", a.context, e.what()));
  }
  if (!context.is_object()) {
    throw InvalidArgument("context", fmt::format("{}: must be one JSON object", a.context));
  }
  std::string source;
  if (!a.file.empty()) {
    source = read_chat_template_file(a.file, "--file");
  } else {
    const gguf::File file = gguf::File::open(a.model, gguf::LoadMode::Mmap);
    auto t = file.opt_string("tokenizer.chat_template");
    if (!t) throw InvalidArgument(fmt::format("{} has no tokenizer.chat_template", a.model));
    source = std::move(*t);
    const auto tok = Tokenizer::create(vocab_from_gguf(file));  // the file opened above, not again
    const Vocab& v = tok->vocab();
    if (!context.contains("bos_token") && v.bos >= 0) context["bos_token"] = v.tokens[v.bos];
    if (!context.contains("eos_token") && v.eos >= 0) context["eos_token"] = v.tokens[v.eos];
  }
  jinja::RenderOptions opt;
  opt.now_unix_seconds = a.now.empty() ? std::chrono::duration_cast<std::chrono::seconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count()
                                       : parse_utc_time(a.now, "--now");
  const jinja::Template tmpl(source);
  const jinja::Rendered r = tmpl.render(context, opt);
  if (a.ranges) {
    nlohmann::ordered_json j;
    j["text"] = r.text;
    j["template_ranges"] = nlohmann::ordered_json::array();
    for (const auto& range : r.template_ranges) {
      j["template_ranges"].push_back({range.begin, range.end});
    }
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    return;
  }
  std::fwrite(r.text.data(), 1, r.text.size(), stdout);
  std::fflush(stdout);
}

}  // namespace

void add_template_command(CLI::App& app) {
  auto args = std::make_shared<TemplateArgs>();
  auto* sub = app.add_subcommand(
      "template", "Render a Jinja chat template with a JSON context and print the text");
  sub->add_option("--file", args->file, "The template (a .jinja file)");
  sub->add_option("-m,--model", args->model,
                  "A GGUF model whose tokenizer.chat_template to render");
  sub->add_option("--context", args->context,
                  "A JSON object of the template's variables: messages, tools, "
                  "add_generation_prompt, bos_token, ...")
      ->required();
  sub->add_option("--now", args->now,
                  "strftime_now's clock: a UTC time (2024-07-26T08:30:00Z) or seconds since 1970 "
                  "(default: the system clock)");
  sub->add_flag("--ranges", args->ranges,
                "Print JSON: the text and the byte ranges the template wrote itself (the rest is "
                "content, never parsed for special tokens)");
  sub->callback([args] { run_template(*args); });
}

}  // namespace encore::cli
