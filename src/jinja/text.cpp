#include "jinja/text.h"

#include <unicode/casemap.h>
#include <unicode/locid.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>

namespace encore::jinja {

namespace {

struct Cp {
  uint32_t cp;
  size_t b, e;
};

std::vector<Cp> code_points(std::string_view s) {
  const auto offs = code_point_offsets(s);
  std::vector<Cp> out;
  out.reserve(offs.size());
  for (size_t k = 0; k + 1 < offs.size(); ++k) {
    out.push_back({decode_cp(s, offs[k], offs[k + 1]), offs[k], offs[k + 1]});
  }
  return out;
}

void put_utf8(std::string& out, uint32_t cp) {
  icu::UnicodeString u(static_cast<UChar32>(cp));
  u.toUTF8String(out);
}

bool cased(uint32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  return u_isupper(c) || u_islower(c) || u_istitle(c);
}

}  // namespace

bool is_space_byte(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || (c >= '\x1c' && c <= '\x1f');
}

bool is_py_space(uint32_t cp) {
  if (cp < 0x80) return is_space_byte(static_cast<char>(cp));
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

Str py_strip(const Str& s, const std::string* chars, bool left, bool right) {
  const auto cps = code_points(s.text);
  std::vector<uint32_t> set;
  if (chars) {
    for (const Cp& c : code_points(*chars)) set.push_back(c.cp);
  }
  auto strip = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_py_space(cp);
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b].cp)) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1].cp)) --e;
  }
  if (b == e) return Str();
  return s.sub(cps[b].b, cps[e - 1].e);
}

std::vector<std::pair<size_t, size_t>> py_splitlines(std::string_view s) {
  std::vector<std::pair<size_t, size_t>> out;
  const auto cps = code_points(s);
  size_t start = 0;
  for (size_t k = 0; k < cps.size(); ++k) {
    const uint32_t c = cps[k].cp;
    const bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                     c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    out.emplace_back(start, cps[k].b);
    if (c == '\r' && k + 1 < cps.size() && cps[k + 1].cp == '\n') ++k;
    start = cps[k].e;
  }
  if (start < s.size()) out.emplace_back(start, s.size());
  return out;
}

namespace {

enum class Case { Upper, Lower, Title };

// The full case mapping of one code point (Python's str methods use the
// full mappings: 'ß'.title() is 'Ss', 'İ'.lower() is 'i̇'), appended as UTF-8.
void put_full_case(std::string& out, UChar32 c, Case how) {
  if (c < 0x80) {  // ASCII: the simple mapping is the full one
    put_utf8(out, static_cast<uint32_t>(how == Case::Upper   ? u_toupper(c)
                                        : how == Case::Lower ? u_tolower(c)
                                                             : u_totitle(c)));
    return;
  }
  UChar src[2];
  int32_t n = 0;
  U16_APPEND_UNSAFE(src, n, c);
  UChar dst[16];
  UErrorCode err = U_ZERO_ERROR;
  int32_t len = 0;
  if (how == Case::Upper) {
    len = icu::CaseMap::toUpper("", 0, src, n, dst, 16, nullptr, err);
  } else if (how == Case::Lower) {
    len = icu::CaseMap::toLower("", 0, src, n, dst, 16, nullptr, err);
  } else {
    // One code point is the whole "string": no break iterator needed.
    len = icu::CaseMap::toTitle(
        "", U_TITLECASE_WHOLE_STRING | U_TITLECASE_NO_BREAK_ADJUSTMENT | U_TITLECASE_NO_LOWERCASE,
        nullptr, src, n, dst, 16, nullptr, err);
  }
  if (U_FAILURE(err)) {
    put_utf8(out, static_cast<uint32_t>(c));
    return;
  }
  icu::UnicodeString(dst, len).toUTF8String(out);
}

}  // namespace

std::string py_case(std::string_view s, std::string_view how) {
  const icu::UnicodeString u =
      icu::UnicodeString::fromUTF8(icu::StringPiece(s.data(), static_cast<int32_t>(s.size())));
  std::string out;
  if (how == "upper") {
    icu::UnicodeString(u).toUpper(icu::Locale::getRoot()).toUTF8String(out);
  } else if (how == "lower") {
    icu::UnicodeString(u).toLower(icu::Locale::getRoot()).toUTF8String(out);
  } else if (how == "casefold") {
    icu::UnicodeString(u).foldCase().toUTF8String(out);
  } else {
    // title, capitalize, swapcase: code point by code point (Python's rules).
    bool prev_cased = false;
    bool first = true;
    for (const Cp& c : code_points(s)) {
      const auto ch = static_cast<UChar32>(c.cp);
      if (how == "title") {
        put_full_case(out, ch, prev_cased ? Case::Lower : Case::Title);
        prev_cased = cased(c.cp);
      } else if (how == "capitalize") {
        put_full_case(out, ch, first ? Case::Title : Case::Lower);
      } else if (u_isupper(ch)) {
        put_full_case(out, ch, Case::Lower);
      } else if (u_islower(ch)) {
        put_full_case(out, ch, Case::Upper);
      } else {
        put_utf8(out, c.cp);
      }
      first = false;
    }
  }
  return out;
}

Str py_replace(const Str& s, const std::string& old, const Str& new_s, int64_t count) {
  Str out;
  const std::string& t = s.text;
  if (old.empty()) {
    const auto offs = code_point_offsets(t);
    int64_t done = 0;
    for (size_t k = 0; k < offs.size(); ++k) {
      if (count < 0 || done < count) {
        out.append(new_s);
        ++done;
      }
      if (k + 1 < offs.size()) out.append(s.sub(offs[k], offs[k + 1]));
    }
    return out;
  }
  size_t at = 0;
  for (int64_t k = 0; count < 0 || k < count; ++k) {
    const size_t p = t.find(old, at);
    if (p == std::string::npos) break;
    out.append(s.sub(at, p));
    out.append(new_s);
    at = p + old.size();
  }
  out.append(s.sub(at, t.size()));
  return out;
}

bool py_is(std::string_view s, std::string_view test) {
  const auto cps = code_points(s);
  if (cps.empty()) return false;
  if (test == "isupper" || test == "islower") {
    bool any = false;
    for (const Cp& c : cps) {
      const auto ch = static_cast<UChar32>(c.cp);
      if (test == "isupper" ? u_islower(ch) : u_isupper(ch)) return false;
      any = any || cased(c.cp);
    }
    return any;
  }
  return std::all_of(cps.begin(), cps.end(), [&](const Cp& c) {
    const auto ch = static_cast<UChar32>(c.cp);
    if (test == "isspace") return is_py_space(c.cp);
    if (test == "isdigit" || test == "isdecimal") return u_isdigit(ch) != 0;
    if (test == "isnumeric") return u_isdigit(ch) || u_getNumericValue(ch) != U_NO_NUMERIC_VALUE;
    if (test == "isalpha") return u_isalpha(ch) != 0;
    return u_isalnum(ch) != 0;  // isalnum
  });
}

}  // namespace encore::jinja
