// Jinja2's lexer for chat templates, with the whitespace rules Hugging Face
// renders with: trim_blocks (the newline after a block or comment tag is
// dropped; `+%}` keeps it; never after {% raw %}), lstrip_blocks (spaces and
// tabs before a block or comment tag that starts its line are dropped; `{%+`
// keeps them), `-` on a tag strips all whitespace on that side, newlines are
// normalised to "\n" and one trailing newline of the source is dropped
// (keep_trailing_newline=False). {% raw %} blocks come out as text.
//
// Thread-safety: pure function of its argument.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace encore::jinja::detail {

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  Tok type;
  std::string text;  // Data: the text; Name, Op: as written; String: unescaped; Int, Float: digits
  int line;
};

// A syntax error at a template line.
[[noreturn]] inline void fail_at(int line, std::string msg) {
  throw RenderError{std::move(msg), line};
}

// The tokens of `source`, ending with one Tok::End. Throws RenderError.
std::vector<Token> lex(std::string_view source);

}  // namespace encore::jinja::detail
