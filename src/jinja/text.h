// Python's str operations that depend on Unicode: whitespace (str.isspace),
// line boundaries (str.splitlines), case mapping (upper, lower, title,
// capitalize, via ICU's root locale: no process locale is consulted) and the
// character class tests (isdigit, isalpha ...).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace encore::jinja {

bool is_space_byte(char c);
// str.isspace() for one code point.
bool is_py_space(uint32_t cp);

// s.strip(chars) / lstrip / rstrip: whitespace when chars is null.
Str py_strip(const Str& s, const std::string* chars, bool left, bool right);
// The [begin, end) byte ranges of s.splitlines() (without the line ends).
std::vector<std::pair<size_t, size_t>> py_splitlines(std::string_view s);
// upper, lower, title, capitalize, casefold or swapcase of s.
std::string py_case(std::string_view s, std::string_view how);
// s.replace(old, new, count); new_s carries the replacement's marks.
Str py_replace(const Str& s, const std::string& old, const Str& new_s, int64_t count);
// isdigit, isalpha, isalnum, isspace, isupper, islower, isnumeric, isdecimal.
bool py_is(std::string_view s, std::string_view test);

}  // namespace encore::jinja
