// strftime_now(fmt): Python's datetime.strftime in the C locale, on a naive
// UTC clock (transformers' datetime.now(), the oracle's --now), including
// the glibc `%-d` (no padding) that templates use.
#include <fmt/format.h>

#include <ctime>
#include <string>
#include <string_view>

#include "jinja/builtins.h"

namespace encore::jinja {

std::string strftime_utc(std::string_view fmt_s, int64_t unix_seconds) {
  static const char* const kDays[] = {"Sunday",   "Monday", "Tuesday", "Wednesday",
                                      "Thursday", "Friday", "Saturday"};
  static const char* const kMonths[] = {"January",   "February", "March",    "April",
                                        "May",       "June",     "July",     "August",
                                        "September", "October",  "November", "December"};
  const auto t = static_cast<time_t>(unix_seconds);
  std::tm tm{};
  if (!gmtime_r(&t, &tm)) fail("strftime_now: the clock is out of range");
  std::string out;
  for (size_t i = 0; i < fmt_s.size(); ++i) {
    if (fmt_s[i] != '%' || i + 1 >= fmt_s.size()) {
      out += fmt_s[i];
      continue;
    }
    char c = fmt_s[++i];
    bool pad = true;
    if (c == '-' && i + 1 < fmt_s.size()) {
      pad = false;
      c = fmt_s[++i];
    }
    auto num = [&](int v, int width) {
      out += pad ? fmt::format("{:0{}d}", v, width) : std::to_string(v);
    };
    switch (c) {
      case 'a':
        out += std::string(kDays[tm.tm_wday]).substr(0, 3);
        break;
      case 'A':
        out += kDays[tm.tm_wday];
        break;
      case 'b':
      case 'h':
        out += std::string(kMonths[tm.tm_mon]).substr(0, 3);
        break;
      case 'B':
        out += kMonths[tm.tm_mon];
        break;
      case 'd':
        num(tm.tm_mday, 2);
        break;
      case 'e':
        out += pad ? fmt::format("{:2d}", tm.tm_mday) : std::to_string(tm.tm_mday);
        break;
      case 'm':
        num(tm.tm_mon + 1, 2);
        break;
      case 'Y':
        out += std::to_string(tm.tm_year + 1900);
        break;
      case 'y':
        num(tm.tm_year % 100, 2);
        break;
      case 'H':
        num(tm.tm_hour, 2);
        break;
      case 'I':
        num(tm.tm_hour % 12 == 0 ? 12 : tm.tm_hour % 12, 2);
        break;
      case 'M':
        num(tm.tm_min, 2);
        break;
      case 'S':
        num(tm.tm_sec, 2);
        break;
      case 'p':
        out += tm.tm_hour < 12 ? "AM" : "PM";
        break;
      case 'j':
        num(tm.tm_yday + 1, 3);
        break;
      case 'w':
        out += std::to_string(tm.tm_wday);
        break;
      case 'u':
        out += std::to_string(tm.tm_wday == 0 ? 7 : tm.tm_wday);
        break;
      case 'Z':  // transformers' datetime.now() is naive: no zone name, no offset
      case 'z':
        break;
      case 'F':
        out += fmt::format("{}-{:02d}-{:02d}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday);
        break;
      case 'T':
        out += fmt::format("{:02d}:{:02d}:{:02d}", tm.tm_hour, tm.tm_min, tm.tm_sec);
        break;
      case '%':
        out += '%';
        break;
      default:
        fail(fmt::format("strftime_now: the format %{} is not supported", c));
    }
  }
  return out;
}

}  // namespace encore::jinja
