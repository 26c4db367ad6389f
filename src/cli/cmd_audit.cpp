// `encore audit verify FILE...`: checks an audit log's hash chain across its
// rotated files (include/encore/audit.h, docs/audit.md) and names the first
// broken link. Exit 0 when the chain holds (a torn last line is reported,
// not a break), 1 when it is broken.
#include <fmt/format.h>

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "encore/audit.h"

namespace encore::cli {
namespace {

struct VerifyArgs {
  std::vector<std::string> files;
  bool json = false;
};

void run_verify(const VerifyArgs& a) {
  const audit::VerifyReport rep = audit::verify(a.files);
  if (a.json) {
    nlohmann::ordered_json j;
    j["ok"] = rep.ok();
    j["lines"] = rep.lines;
    j["first_seq"] = rep.first_seq;
    j["last_seq"] = rep.last_seq;
    j["head"] = rep.head;
    j["files"] = rep.files;
    j["notes"] = rep.notes;
    j["broken"] =
        rep.broken.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(rep.broken);
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    for (const std::string& n : rep.notes) fmt::print("note: {}\n", n);
    if (!rep.ok()) fmt::print("broken: {}\n", rep.broken);
    fmt::print("{}: {} lines verified (seq {} to {}) in {} file(s); head {}\n",
               rep.ok() ? "ok" : "BROKEN", rep.lines, rep.first_seq, rep.last_seq, rep.files.size(),
               rep.head.empty() ? "-" : rep.head);
  }
  if (!rep.ok()) std::exit(1);
}

}  // namespace

void add_audit_command(CLI::App& app) {
  CLI::App* audit = app.add_subcommand("audit", "The audit log (docs/audit.md)");
  audit->require_subcommand(1);
  auto args = std::make_shared<VerifyArgs>();
  CLI::App* verify = audit->add_subcommand(
      "verify",
      "Check the hash chain of an audit log and its rotated files (FILE FILE.1 ...); name the "
      "first broken link; exit 1 if broken");
  verify->add_option("files", args->files, "The log's files, in any order")->required();
  verify->add_flag("--json", args->json, "One JSON object instead of text");
  verify->callback([args] { run_verify(*args); });
}

}  // namespace encore::cli
