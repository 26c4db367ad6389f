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
#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/jinja.h"

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

// "2024-07-26T08:30:00Z" (or a date alone, or seconds since the epoch).
int64_t parse_now(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("-0123456789") == std::string::npos) {
    try {
      return std::stoll(s);
    } catch (const std::exception&) {
    }
  }
  int y = 0, mo = 0, d = 0, h = 0, mi = 0, sec = 0;
  char tail[8] = {0};
  const int n =
      std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%7s", &y, &mo, &d, &h, &mi, &sec, tail);
  const bool ok = (n == 3 && s.size() == 10) || (n == 6 && s.size() == 19) ||
                  (n == 7 && std::string(tail) == "Z");
  if (!ok || mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) {
    throw InvalidArgument(
        "now",
        fmt::format("'{}' is not a UTC time like 2024-07-26T08:30:00Z or seconds since 1970", s));
  }
  using namespace std::chrono;
  const auto days =
      sys_days(year{y} / month{static_cast<unsigned>(mo)} / day{static_cast<unsigned>(d)});
  return duration_cast<seconds>(days.time_since_epoch()).count() + h * 3600 + mi * 60 + sec;
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
    source = read_text(a.file, "--file");
  } else {
    const gguf::File file = gguf::File::open(a.model, gguf::LoadMode::Mmap);
    auto t = file.opt_string("tokenizer.chat_template");
    if (!t) throw InvalidArgument(fmt::format("{} has no tokenizer.chat_template", a.model));
    source = std::move(*t);
    const auto tok = load_tokenizer(a.model);
    const Vocab& v = tok->vocab();
    if (!context.contains("bos_token") && v.bos >= 0) context["bos_token"] = v.tokens[v.bos];
    if (!context.contains("eos_token") && v.eos >= 0) context["eos_token"] = v.tokens[v.eos];
  }
  jinja::RenderOptions opt;
  opt.now_unix_seconds = a.now.empty() ? std::chrono::duration_cast<std::chrono::seconds>(
                                             std::chrono::system_clock::now().time_since_epoch())
                                             .count()
                                       : parse_now(a.now);
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
