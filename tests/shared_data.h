// Locating test data in ENCORE_SHARED_DIR (default ../shared beside the repo).
//
// If the folder or a file is missing the test fails with a message naming the
// expected path, unless the build was configured with
// -DENCORE_SKIP_SHARED_TESTS=ON, in which case it is skipped.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace encore::test {

inline std::string shared_dir() { return ENCORE_SHARED_DIR; }

// Full path of `rel` inside the shared folder, or "" after failing/skipping
// the current test. Use through ENCORE_SHARED_FILE below.
inline std::string shared_file_or_report(const std::string& rel, bool* skip) {
  std::filesystem::path p = std::filesystem::path(ENCORE_SHARED_DIR) / rel;
  if (std::filesystem::exists(p)) return p.string();
  *skip = ENCORE_SKIP_SHARED_TESTS;
  return "";
}

}  // namespace encore::test

// Declares `std::string var` = path of `rel` in the shared folder; fails or
// skips the current test when it is missing.
#define ENCORE_SHARED_FILE(var, rel)                                                            \
  bool var##_skip = false;                                                                      \
  std::string var = ::encore::test::shared_file_or_report(rel, &var##_skip);                    \
  if (var.empty()) {                                                                            \
    if (var##_skip) GTEST_SKIP() << "test data missing (ENCORE_SKIP_SHARED_TESTS=ON): " << rel; \
    FAIL() << "test data missing: expected " << (std::string(ENCORE_SHARED_DIR) + "/" + rel)    \
           << " (set -DENCORE_SHARED_DIR=PATH to its folder, or "                               \
              "-DENCORE_SKIP_SHARED_TESTS=ON to skip data tests)";                              \
  }
