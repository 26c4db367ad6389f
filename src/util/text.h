// Small text helpers shared by every module (no dependencies), and the
// cache directory.
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

// strerror-like text of an errno value, thread-safe.
std::string errno_text(int err);

// Encore's cache directory, the one lookup for every cache (the state tiers'
// default_state_dir, the fingerprint cache): $XDG_CACHE_HOME/encore, else
// $HOME/.cache/encore, else "" (none). Relative values are ignored, as the
// XDG spec asks. Reads the environment: not thread-safe against setenv.
std::string cache_dir();

}  // namespace encore::util
