#include "engine/output/stop_text.h"

#include <fmt/format.h>

#include <algorithm>

#include "encore/error.h"

namespace encore {

StopText::Push StopText::push(std::string_view piece) {
  held_ += piece;
  Push out;
  // The earliest match of any stop string wins.
  size_t match = std::string::npos;
  for (const std::string& s : stops_) match = std::min(match, held_.find(s));
  if (match != std::string::npos) {
    if (match > shown_) out.text = held_.substr(shown_, match - shown_);
    out.matched = true;
    held_.clear();
    shown_ = 0;
    return out;
  }
  // Keep the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& s : stops_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  const size_t safe = held_.size() - keep;
  if (safe > shown_) out.text = held_.substr(shown_, safe - shown_);
  held_.erase(0, safe);
  shown_ = shown_ > safe ? shown_ - safe : 0;
  return out;
}

std::string StopText::flush_shown() {
  std::string out = held_.substr(shown_);
  shown_ = held_.size();
  return out;
}

void StopText::restore(std::string held, size_t shown) {
  if (shown > held.size()) {
    throw InvalidArgument(fmt::format("stop-string state: {} bytes marked shown but only {} held",
                                      shown, held.size()));
  }
  held_ = std::move(held);
  shown_ = shown;
}

}  // namespace encore
