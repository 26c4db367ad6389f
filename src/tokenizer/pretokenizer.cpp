// Pre-tokenizer pipelines per tokenizer.ggml.pre, with PCRE2 (UTF + UCP,
// JIT when available) for the patterns and ICU for NFC.
//
// Every stage works like a Hugging Face `Split` with behaviour "Isolated":
// it runs on each word the previous stages produced, on its own (lookaround
// never sees a neighbouring word), and cuts it into the matches and the
// non-empty gaps between them. This is also how llama.cpp applies its lists
// of patterns.
#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <span>

#include "encore/error.h"
#include "tokenizer/internal.h"

namespace encore::tokenizer_detail {
namespace {

enum class StageKind {
  kRegex,         // isolate the matches of a pattern
  kMappedDigits,  // Falcon: runs of bytes whose byte-level symbol is numeric
  kDigitTriples,  // Falcon: isolate "[0-9][0-9][0-9]", left to right
};

struct StageSpec {
  StageKind kind;
  std::string_view pattern;  // kRegex only
};

struct PreSpec {
  std::string_view name;
  std::span<const StageSpec> stages;
  bool nfc;            // Unicode NFC before splitting (the model's normalizer)
  bool ignore_merges;  // see PreTokenizer::ignore_merges()
};

// GPT-2's pattern, as Hugging Face's ByteLevel pre-tokenizer (use_regex)
// writes it. llama.cpp drops the final "\s+"; that changes nothing because
// unmatched text becomes a word of its own anyway.
constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3 (and, with single digits, Qwen2): the tokenizer.json patterns
// verbatim. llama.cpp spells "(?i:'s|...)" as "'[sS]|..." because std::regex
// lacks inline flags; PCRE2 has them. Caseless matching uses Unicode case
// folding, so "'ſ" (U+017F LONG S) matches too, as it does in Hugging Face's
// Oniguruma.
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N})"
                                    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Hugging Face's Digits pre-tokenizer (Rust char::is_numeric = \p{N}).
constexpr std::string_view kEachDigit = R"(\p{N})";
constexpr std::string_view kDigitRuns = R"(\p{N}+)";

// Falcon's Punctuation pre-tokenizer: ASCII punctuation (which includes the
// symbols $+<=>^`|~) or a Unicode P* character, contiguous runs together.
constexpr std::string_view kPunctRuns = R"([\p{P}!-/:-@\[-`{-~]+)";
// llama.cpp's fallback for "default" (no Hugging Face counterpart: it is what
// llama.cpp uses for a BPE vocabulary whose converter named no pre-tokenizer).
constexpr std::string_view kDefaultPunct = R"([\p{P}\$\+<=>\^~\|]+)";

// DeepSeek LLM / Coder splits (their tokenizer.json Split patterns). The
// letter class is DeepSeek's list of cased-letter ranges, written as code
// points because several of its characters (U+1F7D, U+1FBE, U+2126, U+212A
// ...) are canonical singletons that text tools silently normalise away.
constexpr std::string_view kNewline = R"([\r\n])";
constexpr std::string_view kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293})"
    R"(\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A})"
    R"(\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556})"
    R"(\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
    R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D})"
    R"(\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D})"
    R"(\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4})"
    R"(\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
    R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124})"
    R"(\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F})"
    R"(\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4})"
    R"(\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17})"
    R"(\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3})"
    R"(\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF})"
    R"(\x{1E900}-\x{1E943}]+)";
constexpr std::string_view kDeepseekPunct =
    R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";
// DeepSeek writes "\s+$". The match is always the whole run of white space
// that ends the word, so this is the same pattern, but the look-behind makes
// a start inside such a run fail at once. Plain "\s+$" retries from every
// position of a run that is followed by a non-space: quadratic in PCRE2's
// interpreter (40,000 spaces and a CJK character: 18 s; 1 MiB: hours). The
// JIT happens to skip those retries, but the JIT is optional. Every other
// pattern here either fails within one or two characters or, where a
// failing attempt scans a run ("\s*[\r\n]+"), sits in an alternation whose
// "\s+" then consumes that run, so splitting stays linear without the JIT.
constexpr std::string_view kTrailingSpace = R"((?<!\s)\s+$)";
constexpr std::string_view kDeepseekCjk =
    R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
constexpr std::string_view kDeepseekCoderLetters = R"(\s?\p{L}+)";
constexpr std::string_view kDeepseekCoderPunct = R"(\s?\p{P}+)";

constexpr StageSpec kGpt2Stages[] = {{StageKind::kRegex, kGpt2}};
constexpr StageSpec kLlama3Stages[] = {{StageKind::kRegex, kLlama3}};
constexpr StageSpec kQwen2Stages[] = {{StageKind::kRegex, kQwen2}};
// StarCoder(2), Refact, SmolLM: Digits(individual_digits) then ByteLevel.
constexpr StageSpec kStarcoderStages[] = {{StageKind::kRegex, kEachDigit},
                                          {StageKind::kRegex, kGpt2}};
// Falcon: Punctuation, ByteLevel (GPT-2 pattern), Digits, Split("[0-9]{3}").
// The last two run on the byte-level symbols, not on the characters of the
// text, so no pattern over the text can express them: the bytes B2 B3 B9
// BC BD BE map to the symbols ² ³ ¹ ¼ ½ ¾, which are numeric, so Hugging
// Face cuts words in the middle of characters such as "½" (C2 BD) or "м"
// (D0 BC). They are done byte by byte (kMappedDigits, kDigitTriples).
// llama.cpp runs "[0-9][0-9][0-9]" on the text and skips the Digits step,
// so it keeps "м" whole where Hugging Face does not; we follow Hugging Face.
constexpr StageSpec kFalconStages[] = {{StageKind::kRegex, kPunctRuns},
                                       {StageKind::kRegex, kGpt2},
                                       {StageKind::kMappedDigits, {}},
                                       {StageKind::kDigitTriples, {}}};
constexpr StageSpec kDeepseekLlmStages[] = {
    {StageKind::kRegex, kNewline},       {StageKind::kRegex, kDeepseekLetters},
    {StageKind::kRegex, kDeepseekPunct}, {StageKind::kRegex, kTrailingSpace},
    {StageKind::kRegex, kDeepseekCjk},   {StageKind::kRegex, kDigitRuns}};
constexpr StageSpec kDeepseekCoderStages[] = {{StageKind::kRegex, kNewline},
                                              {StageKind::kRegex, kDeepseekCoderLetters},
                                              {StageKind::kRegex, kDeepseekCoderPunct},
                                              {StageKind::kRegex, kDeepseekCjk},
                                              {StageKind::kRegex, kEachDigit}};
constexpr StageSpec kDefaultStages[] = {{StageKind::kRegex, kDefaultPunct},
                                        {StageKind::kRegex, kGpt2},
                                        {StageKind::kRegex, kDigitRuns}};

// The names are llama.cpp's (tokenizer.ggml.pre as its converter writes it;
// "llama3"/"llama-v3" and "smollm" are its aliases with the same pipelines).
// NFC: Qwen2's and GPT-NeoX's (MPT's) tokenizer.json normalise to NFC before
// splitting; llama.cpp does not normalise at all, so for decomposed input
// ("e" + U+0301) it gives other ids than the model was trained with.
constexpr PreSpec kPres[] = {
    {"default", kDefaultStages, false, false},
    {"gpt-2", kGpt2Stages, false, false},
    {"mpt", kGpt2Stages, true, false},
    {"llama-bpe", kLlama3Stages, false, true},
    {"llama3", kLlama3Stages, false, true},
    {"llama-v3", kLlama3Stages, false, true},
    {"qwen2", kQwen2Stages, true, false},
    {"deepseek-llm", kDeepseekLlmStages, false, false},
    {"deepseek-coder", kDeepseekCoderStages, false, false},
    {"falcon", kFalconStages, false, false},
    {"starcoder", kStarcoderStages, false, false},
    {"refact", kStarcoderStages, false, false},
    {"smollm", kStarcoderStages, false, false},
};

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  const int n = pcre2_get_error_message(code, buf, sizeof buf);
  return n < 0 ? fmt::format("PCRE2 error {}", code)
               : std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

// Whether the byte-level symbol of byte `b` is numeric (Rust's
// char::is_numeric): the digits and the Latin-1 symbols ² ³ ¹ ¼ ½ ¾, which
// the GPT-2 byte map leaves as themselves.
bool mapped_numeric(uint8_t b) {
  return (b >= '0' && b <= '9') || b == 0xB2 || b == 0xB3 || b == 0xB9 || (b >= 0xBC && b <= 0xBE);
}

bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }

// White space as Hugging Face's Oniguruma and Unicode's White_Space property
// define it. PCRE2 adds U+180E MONGOLIAN VOWEL SEPARATOR to \s (it was a
// space before Unicode 6.3 and PCRE2 keeps it in \h), which splits " \u180E"
// apart where the models' tokenizers keep it together. So the patterns are
// written as in tokenizer.json and every \s / \S is spelled out here.
constexpr std::string_view kWhiteSpace =
    R"(\t\n\x{0B}\f\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// `pattern` with \s and \S replaced by kWhiteSpace classes (\S never
// appears inside a class in the table above).
std::string with_unicode_whitespace(std::string_view pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        if (in_class) {
          out += kWhiteSpace;
        } else {
          out += '[';
          out += kWhiteSpace;
          out += ']';
        }
      } else if (e == 'S' && !in_class) {
        out += "[^";
        out += kWhiteSpace;
        out += ']';
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

void push_word(std::vector<PreTokenizer::Word>* out, size_t begin, size_t end) {
  if (end > begin) {
    out->push_back(
        PreTokenizer::Word{static_cast<uint32_t>(begin), static_cast<uint32_t>(end - begin)});
  }
}

}  // namespace

struct PreTokenizer::Stage {
  StageKind kind;
  std::unique_ptr<pcre2_code, CodeDeleter> code;  // kRegex only
};

PreTokenizer::PreTokenizer(std::string_view pre) {
  const PreSpec* spec = nullptr;
  for (const PreSpec& s : kPres) {
    if (s.name == pre) spec = &s;
  }
  if (spec == nullptr) {
    std::string known;
    for (std::string_view n : known_names()) {
      if (!known.empty()) known += ", ";
      known += n;
    }
    throw ModelError(fmt::format(
        "vocabulary: BPE pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported (known: {}); "
        "guessing its word splitting would silently give other ids than the model was trained "
        "with",
        printable(pre), known));
  }
  ignore_merges_ = spec->ignore_merges;
  if (spec->nfc) {
    UErrorCode status = U_ZERO_ERROR;
    nfc_ = icu::Normalizer2::getNFCInstance(status);
    if (U_FAILURE(status) || nfc_ == nullptr) {
      throw ModelError(
          fmt::format("ICU cannot load its NFC normalizer data ({})", u_errorName(status)));
    }
  }
  for (const StageSpec& st : spec->stages) {
    Stage stage{st.kind, nullptr};
    if (st.kind == StageKind::kRegex) {
      const std::string pattern = with_unicode_whitespace(st.pattern);
      int err = 0;
      PCRE2_SIZE err_offset = 0;
      // MATCH_INVALID_UTF: the text may hold ill-formed UTF-8, which must
      // simply never match (and must not make PCRE2 reject the subject).
      pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                       PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err,
                                       &err_offset, nullptr);
      if (code == nullptr) {
        // Only a bug in the table above gets here.
        throw Error(fmt::format("pre-tokenizer '{}': pattern does not compile at offset {}: {}",
                                spec->name, err_offset, pcre2_message(err)));
      }
      stage.code.reset(code);
      // Without JIT support PCRE2 interprets the pattern: slower, same result.
      (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    }
    stages_.push_back(std::move(stage));
  }
}

PreTokenizer::~PreTokenizer() = default;

std::vector<std::string_view> PreTokenizer::known_names() {
  std::vector<std::string_view> names;
  for (const PreSpec& s : kPres) names.push_back(s.name);
  return names;
}

void PreTokenizer::split(std::string_view text, std::vector<Word>* words) const {
  words->clear();
  if (text.empty()) return;
  if (text.size() > std::numeric_limits<uint32_t>::max()) {
    throw InvalidArgument(fmt::format("text of {} bytes is too long to pre-tokenize", text.size()));
  }
  // One ovector pair is enough: only the whole match is used (pcre2_match
  // then returns 0 for patterns with groups, which still is a match).
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create(1, nullptr));
  if (md == nullptr) throw Error("PCRE2 could not allocate match data");
  PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());

  std::vector<Word> in{Word{0, static_cast<uint32_t>(text.size())}};
  std::vector<Word>& out = *words;
  for (const Stage& stage : stages_) {
    out.clear();
    out.reserve(in.size() + in.size() / 2 + 8);
    for (const Word& w : in) {
      const char* s = text.data() + w.begin;
      const size_t n = w.len;
      size_t last = 0;  // end of the previous match, relative to the word
      switch (stage.kind) {
        case StageKind::kRegex: {
          size_t start = 0;
          while (start < n) {
            const int rc = pcre2_match(stage.code.get(), reinterpret_cast<PCRE2_SPTR>(s), n, start,
                                       0, md.get(), nullptr);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
              throw Error(fmt::format("pre-tokenizer: PCRE2 failed on a word of {} bytes: {}", n,
                                      pcre2_message(rc)));
            }
            const size_t m0 = ov[0];
            const size_t m1 = ov[1];
            if (m1 <= m0) {  // an empty match (no supported pattern has one): step on
              start = m0 + 1;
              continue;
            }
            push_word(&out, w.begin + last, w.begin + m0);
            push_word(&out, w.begin + m0, w.begin + m1);
            last = start = m1;
          }
          break;
        }
        case StageKind::kMappedDigits: {
          for (size_t i = 1; i < n; ++i) {
            if (mapped_numeric(static_cast<uint8_t>(s[i])) !=
                mapped_numeric(static_cast<uint8_t>(s[i - 1]))) {
              push_word(&out, w.begin + last, w.begin + i);
              last = i;
            }
          }
          break;
        }
        case StageKind::kDigitTriples: {
          for (size_t i = 0; i + 3 <= n;) {
            if (is_ascii_digit(s[i]) && is_ascii_digit(s[i + 1]) && is_ascii_digit(s[i + 2])) {
              push_word(&out, w.begin + last, w.begin + i);
              push_word(&out, w.begin + i, w.begin + i + 3);
              last = i += 3;
            } else {
              ++i;
            }
          }
          break;
        }
      }
      push_word(&out, w.begin + last, w.begin + n);
    }
    in.swap(out);
  }
  out.swap(in);
}

std::string_view PreTokenizer::normalize(std::string_view text, std::string* storage) const {
  if (nfc_ == nullptr) return text;
  // Pure ASCII is always NFC (there is no combining mark to compose).
  if (std::all_of(text.begin(), text.end(),
                  [](char c) { return static_cast<uint8_t>(c) < 0x80; })) {
    return text;
  }
  // Well-formed runs are normalised; ill-formed bytes between them are kept
  // (ICU would turn them into U+FFFD, and the bytes must survive).
  UErrorCode status = U_ZERO_ERROR;
  const auto normalized = [&](std::string_view run) {
    return nfc_->isNormalizedUTF8(icu::StringPiece(run.data(), static_cast<int32_t>(run.size())),
                                  status);
  };
  struct Run {
    size_t begin, end;
    bool valid;
  };
  std::vector<Run> runs;
  bool changed = false;
  for (size_t i = 0; i < text.size();) {
    size_t j = i;
    while (j < text.size()) {
      const Utf8Seq seq = scan_utf8(text, j);
      if (seq.kind != Utf8Kind::Complete) break;
      j += seq.len;
    }
    if (j > i) {
      runs.push_back(Run{i, j, true});
      if (!normalized(text.substr(i, j - i))) changed = true;
      i = j;
    } else {
      const size_t len = scan_utf8(text, i).len;  // an ill-formed subpart
      runs.push_back(Run{i, i + len, false});
      i += len;
    }
  }
  if (U_FAILURE(status)) {
    throw Error(fmt::format("ICU NFC check failed: {}", u_errorName(status)));
  }
  if (!changed) return text;
  storage->clear();
  storage->reserve(text.size() + text.size() / 8);
  icu::StringByteSink<std::string> sink(storage);
  for (const Run& r : runs) {
    const std::string_view run = text.substr(r.begin, r.end - r.begin);
    if (!r.valid) {
      storage->append(run);
      continue;
    }
    // normalizeUTF8 writes into `storage` through the sink.
    nfc_->normalizeUTF8(0, icu::StringPiece(run.data(), static_cast<int32_t>(run.size())), sink,
                        nullptr, status);
    if (U_FAILURE(status)) {
      throw Error(fmt::format("ICU NFC normalisation failed: {}", u_errorName(status)));
    }
  }
  return *storage;
}

}  // namespace encore::tokenizer_detail
