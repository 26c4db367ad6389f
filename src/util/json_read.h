// Reading untrusted JSON (run states, audit logs) into typed values: every
// value range-checked, every error naming where it is (InvalidArgument).
// nlohmann's own get<> would wrap an out-of-range integer or turn 1e300 into
// an int by undefined behaviour. Header-only; thread-safe (pure functions).
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "encore/error.h"

namespace encore::util {

// Works on nlohmann::json and nlohmann::ordered_json alike.
// One JSON value as T, range-checked (nlohmann's get<> would wrap an
// out-of-range integer or turn 1e300 into an int by undefined behaviour).
template <typename T, typename Json>
T json_convert(const Json& v, const std::string& what) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) throw InvalidArgument(fmt::format("{} must be true or false", what));
    return v.template get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) throw InvalidArgument(fmt::format("{} must be an integer", what));
    const bool ok =
        v.is_number_unsigned()
            ? v.template get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
            : v.template get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                  (v.template get<int64_t>() < 0 ||
                   static_cast<uint64_t>(v.template get<int64_t>()) <=
                       static_cast<uint64_t>(std::numeric_limits<T>::max()));
    if (!ok) {
      throw InvalidArgument(fmt::format("{} = {} is out of range [{}, {}]", what, v.dump(),
                                        std::numeric_limits<T>::min(),
                                        std::numeric_limits<T>::max()));
    }
    return v.is_number_unsigned() ? static_cast<T>(v.template get<uint64_t>())
                                  : static_cast<T>(v.template get<int64_t>());
  } else if constexpr (std::is_same_v<T, float>) {
    if (!v.is_number()) throw InvalidArgument(fmt::format("{} must be a number", what));
    const double d = v.template get<double>();
    if (!(std::fabs(d) <= std::numeric_limits<float>::max())) {
      throw InvalidArgument(fmt::format("{} = {} is not a finite float", what, v.dump()));
    }
    return static_cast<float>(d);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) throw InvalidArgument(fmt::format("{} must be a string", what));
    return v.template get<std::string>();
  } else if constexpr (std::is_same_v<T, nlohmann::json> ||
                       std::is_same_v<T, nlohmann::ordered_json>) {
    return v;
  } else {  // std::vector<U>
    if (!v.is_array()) throw InvalidArgument(fmt::format("{} must be an array", what));
    T out;
    out.reserve(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      out.push_back(json_convert<typename T::value_type>(v[i], fmt::format("{}[{}]", what, i)));
    }
    return out;
  }
}

// Reads field `key` of `j` as T; errors name the file and the field.
template <typename T, typename Json>
T json_get(const Json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    throw InvalidArgument(fmt::format("{}: missing field '{}'", where, key));
  }
  return json_convert<T>(j.at(key), fmt::format("{}: field '{}'", where, key));
}

// Member `key` of object `j` by reference (no copy of a large subtree);
// InvalidArgument naming where when `j` is not an object or lacks it.
template <typename Json>
const Json& json_member(const Json& j, const std::string& key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) {
    throw InvalidArgument(fmt::format("{}: missing field '{}'", where, key));
  }
  return j.at(key);
}

// Whether the JSON text nests arrays and objects at most `max_depth` deep
// (strings skipped), checked before parsing text from outside: a deep
// value parses, but copying or comparing it recurses once per level.
inline bool json_depth_within(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return false;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return true;
}

}  // namespace encore::util
