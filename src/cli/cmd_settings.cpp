// `encore settings`: the settings table (include/encore/settings.h) as the
// Markdown table docs/settings.md holds; hidden from --help (a maintainer's
// tool: `encore settings > table.md`, pasted into the docs; a test compares).
#include <fmt/format.h>

#include "cli/commands.h"
#include "encore/settings.h"

namespace encore::cli {

void add_settings_command(CLI::App& app) {
  CLI::App* sub = app.add_subcommand("settings", "Print the settings table as Markdown");
  sub->group("");  // hidden
  sub->callback([] { fmt::print("{}", settings::markdown_table()); });
}

}  // namespace encore::cli
