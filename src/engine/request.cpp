// Request::validate (request.h): the checks of a request that need no model
// beyond the vocabulary size, ranges from the settings table (settings.h).
#include <fmt/format.h>

#include <optional>
#include <type_traits>

#include "encore/error.h"
#include "encore/request.h"
#include "encore/tokenizer.h"  // is_valid_utf8

namespace encore {

void Request::validate(int n_vocab) const {
  sampling.validate(n_vocab);
  visit_settings(*this, [](const settings::Setting& s, const auto& v) {
    if constexpr (std::is_arithmetic_v<std::remove_cvref_t<decltype(v)>>) {
      settings::check(s, static_cast<double>(v));
    }  // seed: every uint64 is one
  });
  if (stop.size() > kMaxStopStrings) {
    throw InvalidArgument(
        "stop", fmt::format("{} strings given; at most {}", stop.size(), kMaxStopStrings));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    const std::string& s = stop[i];
    const std::string field = fmt::format("stop[{}]", i);
    if (s.empty() || s.size() > kMaxStopBytes) {
      throw InvalidArgument(
          field, fmt::format("{} bytes; a stop string must have 1 to {}", s.size(), kMaxStopBytes));
    }
    // The text it is matched in is valid UTF-8; an invalid stop string could
    // match inside a character and cut the text there.
    if (!is_valid_utf8(s)) throw InvalidArgument(field, "not valid UTF-8");
  }
  if (tenant.size() > kMaxTenantBytes) {
    throw InvalidArgument("tenant",
                          fmt::format("{} bytes; at most {}", tenant.size(), kMaxTenantBytes));
  }
}

}  // namespace encore
