#include "engine/normalize.h"

#include <fmt/format.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <cstdint>
#include <limits>

#include "encore/error.h"
#include "encore/request.h"
#include "encore/tokenizer.h"  // is_valid_utf8

namespace encore {

std::string normalize_text(std::string_view text, const std::string& field) {
  // ICU indexes with int32_t.
  if (text.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    throw InvalidArgument(field, fmt::format("{} bytes: too long to normalize", text.size()));
  }
  if (!is_valid_utf8(text)) {
    throw InvalidArgument(field, "not valid UTF-8, which normalize_input needs to normalize it");
  }
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(status);
  if (U_FAILURE(status) || nfc == nullptr) {
    throw Error(fmt::format("ICU cannot load its NFC normalizer data ({})", u_errorName(status)));
  }
  std::string out;
  out.reserve(text.size());
  icu::StringByteSink<std::string> sink(&out);
  nfc->normalizeUTF8(0, icu::StringPiece(text.data(), static_cast<int32_t>(text.size())), sink,
                     nullptr, status);
  if (U_FAILURE(status)) {
    throw Error(fmt::format("ICU NFC normalisation failed: {}", u_errorName(status)));
  }
  // Trim on the normalized text: NFC never turns a non-space into a space.
  const auto* s = reinterpret_cast<const uint8_t*>(out.data());
  const auto len = static_cast<int32_t>(out.size());
  int32_t begin = 0;
  while (begin < len) {
    int32_t next = begin;
    UChar32 c = 0;
    U8_NEXT(s, next, len, c);
    if (c < 0 || !u_isUWhiteSpace(c)) break;
    begin = next;
  }
  int32_t end = len;
  while (end > begin) {
    int32_t prev = end;
    UChar32 c = 0;
    U8_PREV(s, begin, prev, c);
    if (c < 0 || !u_isUWhiteSpace(c)) break;
    end = prev;
  }
  return out.substr(static_cast<size_t>(begin), static_cast<size_t>(end - begin));
}

void normalize_request_text(Request& r) {
  if (!r.prompt.empty()) r.prompt = normalize_text(r.prompt, "prompt");
  for (size_t i = 0; i < r.messages.size(); ++i) {
    std::string& content = r.messages[i].content;
    content = normalize_text(content, fmt::format("messages[{}].content", i));
  }
}

}  // namespace encore
