// Jinja2's lexer with the whitespace rules of lex.h.
#include "jinja/lex.h"

#include <fmt/format.h>

#include <cctype>
#include <cstring>

namespace encore::jinja::detail {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Newlines normalised, one trailing newline dropped (jinja2 lexer).
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t start = find_tag(pos_);
      std::string data = src_.substr(pos_, start - pos_);
      if (start == src_.size()) {
        emit_data(std::move(data), pos_);
        break;
      }
      const char kind = src_[start + 1];  // '{', '%' or '#'
      const char mod = start + 2 < src_.size() ? src_[start + 2] : '\0';
      const bool line_starting = pos_ == 0 || src_[pos_ - 1] == '\n';
      if (mod == '-') {
        while (!data.empty() && is_space(data.back())) data.pop_back();
      } else if (mod != '+' && kind != '{') {
        const size_t nl = data.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = l_pos < data.size();
          for (size_t k = l_pos; k < data.size(); ++k) blank = blank && is_space(data[k]);
          if (blank) data.resize(l_pos);
        }
      }
      emit_data(std::move(data), pos_);
      pos_ = start + 2 + (mod == '-' || mod == '+' ? 1 : 0);
      if (kind == '#') {
        comment();
      } else if (kind == '%' && raw_block()) {
        continue;
      } else {
        tag(kind == '{');
      }
    }
    out_.push_back({Tok::End, "", line_at(src_.size())});
    return std::move(out_);
  }

 private:
  int line_at(size_t p) {
    while (line_pos_ < p && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  size_t find_tag(size_t from) const {
    for (size_t p = src_.find('{', from); p != std::string::npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        return p;
      }
    }
    return src_.size();
  }

  void emit_data(std::string data, size_t at) {
    if (!data.empty()) out_.push_back({Tok::Data, std::move(data), line_at(at)});
  }

  // After a block or comment end: `-` strips all whitespace, `+` keeps it,
  // else trim_blocks drops one newline.
  enum class End { Plain, Strip, Keep };
  void after_block_end(End how) {
    if (how == End::Strip) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
    } else if (how == End::Plain && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  void comment() {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail_at(line_at(pos_), "unclosed comment: missing '#}'");
    const char mod = end > pos_ ? src_[end - 1] : '\0';
    pos_ = end + 2;
    after_block_end(mod == '-' ? End::Strip : mod == '+' ? End::Keep : End::Plain);
  }

  // {% raw %}...{% endraw %}: the text between is data.
  bool raw_block() {
    size_t p = pos_;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    bool strip = false;
    if (p < src_.size() && src_[p] == '-') {
      strip = true;
      ++p;
    }
    if (src_.compare(p, 2, "%}") != 0) return false;
    pos_ = p + 2;
    // jinja2's raw_begin takes `-%}` but not trim_blocks: a newline after
    // `{% raw %}` is the block's first character.
    if (strip) after_block_end(End::Strip);
    // jinja2's line_starting for the block's text: the raw tag's match ended
    // with a newline, which only `-%}` eating whitespace does.
    const bool line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    const int line = line_at(pos_);
    for (size_t q = src_.find("{%", pos_); q != std::string::npos; q = src_.find("{%", q + 2)) {
      size_t r = q + 2;
      const bool lstrip = r < src_.size() && src_[r] == '-';
      const bool keep = r < src_.size() && src_[r] == '+';
      if (lstrip || keep) ++r;
      while (r < src_.size() && is_space(src_[r])) ++r;
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src_.size() && is_space(src_[r])) ++r;
      End how = End::Plain;
      if (r < src_.size() && (src_[r] == '-' || src_[r] == '+')) {
        how = src_[r] == '-' ? End::Strip : End::Keep;
        ++r;
      }
      if (src_.compare(r, 2, "%}") != 0) continue;
      std::string data = src_.substr(pos_, q - pos_);
      if (lstrip) {
        while (!data.empty() && is_space(data.back())) data.pop_back();
      } else if (!keep) {
        // lstrip_blocks holds for {% endraw %} too: blanks before it on its
        // own line go.
        const size_t nl = data.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = true;
          for (size_t k = l_pos; k < data.size(); ++k) blank = blank && is_space(data[k]);
          if (blank) data.resize(l_pos);
        }
      }
      if (!data.empty()) out_.push_back({Tok::Data, std::move(data), line});
      pos_ = r + 2;
      after_block_end(how);
      return true;
    }
    fail_at(line, "unclosed {% raw %}: missing {% endraw %}");
  }

  void tag(bool var) {
    out_.push_back({var ? Tok::VarBegin : Tok::BlockBegin, "", line_at(pos_)});
    const char close = var ? '}' : '%';
    int balance = 0;  // open ( [ {: an end marker inside them is an operator (jinja2 lexer)
    for (;;) {
      while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        fail_at(line_at(pos_), var ? "unclosed '{{': missing '}}'" : "unclosed '{%': missing '%}'");
      }
      const int line = line_at(pos_);
      const char c = src_[pos_];
      if (balance == 0 && c == '-' && src_.compare(pos_ + 1, 2, std::string{close, '}'}) == 0) {
        pos_ += 3;
        out_.push_back({var ? Tok::VarEnd : Tok::BlockEnd, "", line});
        if (var) {
          while (pos_ < src_.size() && is_space(src_[pos_])) ++pos_;
        } else {
          after_block_end(End::Strip);
        }
        return;
      }
      // `+%}`: this block end keeps the newline after it (no trim_blocks).
      if (!var && balance == 0 && c == '+' && src_.compare(pos_ + 1, 2, "%}") == 0) {
        pos_ += 3;
        out_.push_back({Tok::BlockEnd, "", line});
        return;
      }
      if (balance == 0 && c == close && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') {
        pos_ += 2;
        out_.push_back({var ? Tok::VarEnd : Tok::BlockEnd, "", line});
        if (!var) after_block_end(End::Plain);
        return;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        const size_t b = pos_;
        while (pos_ < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) {
          ++pos_;
        }
        out_.push_back({Tok::Name, src_.substr(b, pos_ - b), line});
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        number(line);
      } else if (c == '\'' || c == '"') {
        string(line);
      } else {
        static const char* const ops[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "*",
                                          "/",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                          ">",  "<",  "=",  ".",  ":",  "|",  ",", ";"};
        bool found = false;
        for (const char* op : ops) {
          const size_t n = std::strlen(op);
          if (src_.compare(pos_, n, op) == 0) {
            out_.push_back({Tok::Op, op, line});
            pos_ += n;
            if (n == 1 && (*op == '(' || *op == '[' || *op == '{')) ++balance;
            if (n == 1 && (*op == ')' || *op == ']' || *op == '}') && balance > 0) --balance;
            found = true;
            break;
          }
        }
        if (!found) fail_at(line, fmt::format("unexpected character '{}'", c));
      }
    }
  }

  void number(int line) {
    // 0x1F, 0o17, 0b101 (with _): jinja2's integer literals in other bases.
    if (src_[pos_] == '0' && pos_ + 2 < src_.size()) {
      const char p = static_cast<char>(std::tolower(static_cast<unsigned char>(src_[pos_ + 1])));
      const int base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (base &&
          (std::isxdigit(static_cast<unsigned char>(src_[pos_ + 2])) || src_[pos_ + 2] == '_')) {
        pos_ += 2;
        unsigned long long v = 0;
        bool over = false;
        for (; pos_ < src_.size(); ++pos_) {
          const char c = src_[pos_];
          if (c == '_') continue;
          if (!std::isxdigit(static_cast<unsigned char>(c))) break;
          const int d =
              std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : std::tolower(c) - 'a' + 10;
          if (d >= base)
            fail_at(line, fmt::format("invalid digit '{}' in a base {} literal", c, base));
          over = over || v > (~0ULL - static_cast<unsigned>(d)) / static_cast<unsigned>(base);
          v = v * static_cast<unsigned>(base) + static_cast<unsigned>(d);
        }
        // Past 64 bits the parser refuses the literal (its text does not fit).
        out_.push_back({Tok::Int, over ? "99999999999999999999" : std::to_string(v), line});
        return;
      }
    }
    const size_t b = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[pos_])) || src_[pos_] == '_')) {
        ++pos_;
      }
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[pos_ + 1]))) {
      is_float = true;
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t q = pos_ + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) {
        is_float = true;
        pos_ = q;
        digits();
      }
    }
    std::string text;
    for (size_t k = b; k < pos_; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    out_.push_back({is_float ? Tok::Float : Tok::Int, std::move(text), line});
  }

  // A quoted string with Python's escapes (\n \t \\ \' \" \xNN \uNNNN ...).
  void string(int line) {
    const char q = src_[pos_++];
    std::string s;
    for (;;) {
      if (pos_ >= src_.size()) fail_at(line, "unterminated string literal");
      const char c = src_[pos_++];
      if (c == q) break;
      if (c != '\\') {
        s += c;
        continue;
      }
      if (pos_ >= src_.size()) fail_at(line, "unterminated string literal");
      const char e = src_[pos_++];
      auto hex = [&](int n) {
        if (pos_ + static_cast<size_t>(n) > src_.size()) fail_at(line, "truncated \\x/\\u escape");
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k) {
          const char h = src_[pos_++];
          if (!std::isxdigit(static_cast<unsigned char>(h))) fail_at(line, "bad \\x/\\u escape");
          cp = cp * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                                   ? h - '0'
                                                   : (std::tolower(h) - 'a' + 10));
        }
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail_at(line, "bad code point escape");
        if (cp < 0x80) {
          s += static_cast<char>(cp);
        } else if (cp < 0x800) {
          s += static_cast<char>(0xC0 | (cp >> 6));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
          s += static_cast<char>(0xE0 | (cp >> 12));
          s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          s += static_cast<char>(0xF0 | (cp >> 18));
          s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
          s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          s += static_cast<char>(0x80 | (cp & 0x3F));
        }
      };
      switch (e) {
        case 'n':
          s += '\n';
          break;
        case 't':
          s += '\t';
          break;
        case 'r':
          s += '\r';
          break;
        case '0':
          s += '\0';
          break;
        case 'a':
          s += '\a';
          break;
        case 'b':
          s += '\b';
          break;
        case 'f':
          s += '\f';
          break;
        case 'v':
          s += '\v';
          break;
        case '\\':
          s += '\\';
          break;
        case '\'':
          s += '\'';
          break;
        case '"':
          s += '"';
          break;
        case '\n':
          break;
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        case 'N':
          fail_at(line, "\\N{...} escapes are not supported");
        default:
          s += '\\';
          s += e;
      }
    }
    out_.push_back({Tok::String, std::move(s), line});
  }

  std::string src_;
  size_t pos_ = 0;
  size_t line_pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(source).run(); }

}  // namespace encore::jinja::detail
