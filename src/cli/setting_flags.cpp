#include "cli/setting_flags.h"

#include <fmt/format.h>

#include <charconv>

namespace encore::cli {

CLI::Validator setting_check(const settings::Setting& s) {
  return CLI::Validator(
      [&s](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v) || !settings::allowed(s, v)) {
          return fmt::format("value {} is not {}", text, settings::expected_text(s));
        }
        return "";
      },
      fmt::format("{} in {}", s.type == settings::Type::Number ? "NUMBER" : "INT",
                  settings::range_text(s)));
}

CLI::Option* add_setting_flag(CLI::App* sub, const settings::Setting& s,
                              std::optional<uint64_t>& member) {
  return sub
      ->add_option_function<std::string>(
          std::string(s.flags),
          [&member, &s](const std::string& text) {
            uint64_t v = 0;
            const char* end = text.data() + text.size();
            if (text == std::to_string(s.off)) {
              member.reset();
            } else if (!text.empty() && text[0] != '-' && text[0] != '+' &&
                       std::from_chars(text.data(), end, v) == std::from_chars_result{end, {}}) {
              member = v;
            } else {
              throw CLI::ValidationError(
                  std::string(settings::long_flag(s)),
                  fmt::format("value {} is not {}", text, settings::expected_text(s)));
            }
          },
          std::string(s.help))
      ->type_name("INT")
      ->check(setting_check(s));
}

CLI::Option* add_setting_flag(CLI::App* sub, const settings::Setting& s, bool& member) {
  return sub->add_flag(std::string(s.flags), member, std::string(s.help));
}

}  // namespace encore::cli
