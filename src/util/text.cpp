#include "util/text.h"

#include <cstdlib>
#include <system_error>

namespace encore::util {

std::string printable(std::string_view s, size_t max_len) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (size_t k = 0; k < s.size(); ++k) {
    if (out.size() >= max_len) {
      out += "...(" + std::to_string(s.size()) + " bytes)";
      break;
    }
    const auto b = static_cast<unsigned char>(s[k]);
    if (b < 0x20 || b >= 0x7f || b == '\'' || b == '\\') {
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 0x0f];
    } else {
      out += s[k];
    }
  }
  return out;
}

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

std::string cache_dir() {
  std::string dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && x[0] == '/') {
    dir.append(x).append("/encore");
  } else if (const char* h = std::getenv("HOME"); h != nullptr && h[0] == '/') {
    dir.append(h).append("/.cache/encore");
  }
  return dir;
}

}  // namespace encore::util
