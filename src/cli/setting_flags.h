// CLI flags from the settings table (include/encore/settings.h): a command
// binds a struct's settings with add_setting_flags(), or one setting with
// add_setting_flag(), and gets the table's names, help, default and range —
// the same in every command. A value outside the range (NaN, inf, a
// fraction for an integer) is refused by CLI11 before the command runs,
// naming the flag.
//
// Ownership: the options write into the bound members, which must outlive
// the parse (commands keep them in a shared_ptr captured by their callback).
// Thread-safety: parse-time only, one thread.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "encore/settings.h"

namespace encore::cli {

// Refuses what settings::allowed() refuses: "value X is not a number in [lo, hi]".
CLI::Validator setting_check(const settings::Setting& s);

// The flag of s bound to `member` (an arithmetic member, a std::chrono
// duration given in seconds, the seed's std::optional<uint64_t>, where -1
// means absent, or a bool: a flag without a value).
CLI::Option* add_setting_flag(CLI::App* sub, const settings::Setting& s,
                              std::optional<uint64_t>& member);
CLI::Option* add_setting_flag(CLI::App* sub, const settings::Setting& s, bool& member);
template <class Rep, class Period>
CLI::Option* add_setting_flag(CLI::App* sub, const settings::Setting& s,
                              std::chrono::duration<Rep, Period>& member) {
  using D = std::chrono::duration<Rep, Period>;
  return sub
      ->add_option_function<double>(
          std::string(s.flags),
          [&member](double seconds) {
            member = std::chrono::duration_cast<D>(std::chrono::duration<double>(seconds));
          },
          std::string(s.help))
      ->check(setting_check(s))
      ->default_str(settings::value_text(s.def));
}
template <class T>
requires std::is_arithmetic_v<T> CLI::Option* add_setting_flag(CLI::App* sub,
                                                               const settings::Setting& s,
                                                               T& member) {
  CLI::Option* o =
      sub->add_option(std::string(s.flags), member, std::string(s.help))->check(setting_check(s));
  if (settings::allowed(s, s.def) && s.def != static_cast<double>(s.off)) {
    o->default_str(settings::value_text(s.def));
  }
  return o;
}

// A flag for every setting of `object` (visit_settings) that `front`
// exposes; returns the options added, in the table's order.
template <class Object>
std::vector<CLI::Option*> add_setting_flags(CLI::App* sub, Object& object, settings::Front front) {
  std::vector<CLI::Option*> added;
  visit_settings(object, [&](const settings::Setting& s, auto& member) {
    if (s.fronts & front) added.push_back(add_setting_flag(sub, s, member));
  });
  return added;
}

}  // namespace encore::cli
