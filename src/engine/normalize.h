// Request::normalize_input: the text a request brings, trimmed and in
// Unicode NFC before it is tokenized, so that inputs that look the same
// ("cafe\u0301 " and "café") get the same tokens.
// Thread-safety: pure (ICU's NFC instance is shared and immutable).
// Cost: O(text).
#pragma once

#include <string>
#include <string_view>

namespace encore {

struct Request;

// `text` in NFC, with leading and trailing White_Space code points (Unicode's
// property: spaces, tabs, newlines, NBSP, ideographic space ...) removed.
// Throws InvalidArgument(field, ...) when it is not valid UTF-8: passing it
// on unnormalised would break the promise that the flag makes.
std::string normalize_text(std::string_view text, const std::string& field);

// The prompt text and each message's content of `r`, normalized in place
// (fields "prompt", "messages[i].content").
void normalize_request_text(Request& r);

}  // namespace encore
