// Small text helpers shared by every module (no dependencies).
// Pure functions; thread-safe; O(length of the input).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace encore::util {

// `s` made safe to show: bytes below 0x20, 0x7F and above, '\\' and '\''
// become "\xNN" (lowercase hex), so untrusted keys, names and token texts can
// go into error messages and terminal output without injecting control
// sequences or breaking the quotes around them. Once the result reaches
// `max_len` characters it is cut and "...(N bytes)" gives the input's size.
std::string printable(std::string_view s, size_t max_len = 96);

}  // namespace encore::util
