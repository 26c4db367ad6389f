// Stop strings matched in generated text across token boundaries.
//
// Decoded text enters with push(). Text that could be the start of a stop
// string is held back until the next pieces decide: a match cuts the text
// at the stop string (neither it nor anything after is shown); otherwise the
// text becomes safe. Held text is at most the longest stop string minus one
// byte plus the last piece.
//
// The held text can also be *shown* early (flush_shown(): a generation that
// pauses at -n shows everything) while staying held for matching, so a
// resumed generation still finds a stop string that spans the pause; the
// bytes already shown are never returned twice.
//
// Plain data; not thread-safe. Cost of push(): O(held * stops).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace encore {

class StopText {
 public:
  StopText() = default;
  explicit StopText(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  struct Push {
    std::string text;      // newly safe text (before the stop string on a match)
    bool matched = false;  // a stop string completed: the generation ends
  };
  Push push(std::string_view piece);

  // The held text not shown yet, marked shown (it stays held for matching).
  std::string flush_shown();

  const std::string& held() const { return held_; }
  size_t shown() const { return shown_; }
  // Throws InvalidArgument if shown > held.size().
  void restore(std::string held, size_t shown);

 private:
  std::vector<std::string> stops_;
  std::string held_;
  size_t shown_ = 0;  // bytes at the start of held_ already returned
};

}  // namespace encore
