// Jinja2's filters, tests, attribute and item lookup (with the immutable
// sandbox's refusals) and the globals of a chat-template render, as
// python3-jinja2 3.1 and Hugging Face transformers define them.
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <string_view>

#include "jinja/value.h"

namespace encore::jinja {

// `v | name(args)`. The name was checked by known_filter when parsing.
Value apply_filter(std::string_view name, const Value& v, Args& args);

// `v is name(args)`. The name was checked by known_test when parsing.
bool apply_test(std::string_view name, const Value& v, Args& args);

// `obj.name`: an attribute first (a method of str, list or dict, bound to
// obj; a namespace's field), then an item; Undefined when neither exists.
// Methods that would change a list or dict give an undefined that fails when
// called (jinja2's ImmutableSandboxedEnvironment).
Value get_attr(const Value& obj, std::string_view name);

// `obj[key]`: an item first (negative indexes count from the end), then, for
// a string key, an attribute; Undefined when neither exists.
Value get_item(const Value& obj, const Value& key);

// obj[start:stop:step] for a list or string (Python's slice rules).
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Calls a function value; fails for anything else (an undefined names what
// was undefined).
Value call(const Value& fn, Args& args);

// The error for using an undefined value ("'x' is undefined", "dict object
// has no attribute 'y'", or the sandbox's refusal of a method).
std::string undefined_message(const Value& v);

// The globals every render sees: namespace, range, dict, raise_exception and
// strftime_now (reading the clock `now_unix_seconds`, UTC).
Dict make_globals(int64_t now_unix_seconds);

// Python's strftime in the C locale, UTC.
std::string strftime_utc(std::string_view fmt, int64_t unix_seconds);

// The message of raise_exception's error, so render() can name it.
inline constexpr std::string_view kRaisePrefix = "raise_exception: ";

}  // namespace encore::jinja
