// `encore tokenize` and `encore detokenize`: a model's tokenizer from the
// command line. Only the GGUF metadata is read (the file is mapped, and the
// tensor data pages are never touched), so this is fast on any model size.
#include <fmt/format.h>

#include <charconv>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/commands.h"
#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/tokenizer.h"

namespace encore::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string text;
  std::string file;
  bool ids = false;
  bool pieces = false;
  bool special = false;
  bool add_bos = false;
};

struct DetokenizeArgs {
  std::string model;
  std::vector<std::string> ids;
  bool special = false;
};

std::string read_all(std::istream& in) {
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Length of the well-formed UTF-8 sequence at s[i], or 0 if there is none
// (Unicode Table 3-7: no overlongs, surrogates or code points past U+10FFFF).
size_t utf8_len(std::string_view s, size_t i) {
  const auto b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return 1;
  size_t n = 0;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    n = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<uint8_t>(s[i + k]);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 0;
  }
  return n;
}

// A piece for display on one line: well-formed UTF-8 as is, "\n", "\t",
// "\r" and "\\" as C escapes, other control bytes and bytes that are not
// well-formed UTF-8 (half a character from a byte token) as \xNN.
std::string escape_piece(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    const size_t n = utf8_len(s, i);
    if (b == '\n') {
      out += "\\n";
    } else if (b == '\t') {
      out += "\\t";
    } else if (b == '\r') {
      out += "\\r";
    } else if (b == '\\') {
      out += "\\\\";
    } else if (n == 0 || b < 0x20 || b == 0x7F) {
      out += fmt::format("\\x{:02X}", b);
    } else {
      out.append(s, i, n);
      i += n;
      continue;
    }
    ++i;
  }
  return out;
}

void run_tokenize(const TokenizeArgs& a, bool text_given) {
  if (text_given == !a.file.empty()) {
    throw InvalidArgument("give the text as an argument or with -f FILE (one of the two)");
  }
  std::string text = a.text;
  if (!a.file.empty()) {
    if (a.file == "-") {
      text = read_all(std::cin);
    } else {
      std::ifstream in(a.file, std::ios::binary);
      if (!in) throw InvalidArgument(fmt::format("-f {}: cannot open the file", a.file));
      text = read_all(in);
    }
  }
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(a.model);
  Tokenizer::EncodeOptions opt;
  opt.add_bos = a.add_bos;
  opt.parse_special = a.special;
  const std::vector<TokenId> ids = tok->encode(text, opt);

  std::string out;
  if (a.ids) {
    out = fmt::format("[{}]\n", fmt::join(ids, ", "));
  } else {
    // Control tokens are shown by their text: an id listing that hid them
    // would be misleading.
    for (TokenId id : ids) {
      const std::string piece = escape_piece(tok->token_to_piece(id, /*render_special=*/true));
      out +=
          a.pieces ? fmt::format("{}\t{}\n", id, piece) : fmt::format("{:6} -> '{}'\n", id, piece);
    }
  }
  fmt::print("{}", out);
}

// Ids from one argument: a JSON array ("[1, 2]") or integers separated by
// spaces or commas ("1 2", "1,2").
void parse_ids(std::string_view arg, std::vector<int64_t>& out) {
  const size_t first = arg.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && arg[first] == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(arg);
    } catch (const nlohmann::json::parse_error& e) {
      throw InvalidArgument(
          fmt::format("'{}' is not a JSON array of token ids: {}", arg, e.what()));
    }
    for (const auto& e : j) {
      if (!e.is_number_integer()) {
        throw InvalidArgument(fmt::format("'{}' is not a token id (in {})", e.dump(), arg));
      }
      out.push_back(e.is_number_unsigned() && e.get<uint64_t>() > INT64_MAX ? INT64_MAX
                                                                            : e.get<int64_t>());
    }
    return;
  }
  size_t i = 0;
  while (i < arg.size()) {
    const size_t start = arg.find_first_not_of(" \t\r\n,", i);
    if (start == std::string_view::npos) break;
    size_t end = arg.find_first_of(" \t\r\n,", start);
    if (end == std::string_view::npos) end = arg.size();
    const std::string_view word = arg.substr(start, end - start);
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(word.data(), word.data() + word.size(), v);
    if (ec != std::errc() || p != word.data() + word.size()) {
      throw InvalidArgument(fmt::format(
          "'{}' is not a token id: give integers (\"1 2 3\") or a JSON array (\"[1, 2, 3]\")",
          word));
    }
    out.push_back(v);
    i = end;
  }
}

void run_detokenize(const DetokenizeArgs& a) {
  std::vector<int64_t> raw;
  if (a.ids.empty()) {
    parse_ids(read_all(std::cin), raw);
  } else {
    for (const std::string& arg : a.ids) parse_ids(arg, raw);
  }
  const std::unique_ptr<Tokenizer> tok = load_tokenizer(a.model);
  std::vector<TokenId> ids;
  ids.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] < 0 || raw[i] >= tok->n_vocab()) {
      throw InvalidArgument(fmt::format(
          "token id {} (position {}) is outside the vocabulary of {}: valid ids are 0..{}", raw[i],
          i, a.model, tok->n_vocab() - 1));
    }
    ids.push_back(static_cast<TokenId>(raw[i]));
  }
  // strip_leading_space undoes the SentencePiece dummy prefix that encoding
  // adds, so that detokenize(tokenize(text)) == text.
  const std::string text = tok->decode(ids, a.special, /*strip_leading_space=*/true);
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fputc('\n', stdout);
}

}  // namespace

void add_tokenize_commands(CLI::App& app) {
  auto targs = std::make_shared<TokenizeArgs>();
  CLI::App* tok = app.add_subcommand(
      "tokenize", "Text to token ids with a model's tokenizer (reads only the GGUF metadata)");
  tok->add_option("-m,--model", targs->model, "Model or vocabulary .gguf")->required();
  CLI::Option* text = tok->add_option("text", targs->text, "Text to tokenize");
  tok->add_option("-f,--file", targs->file, "Read the text from a file (- for stdin)");
  CLI::Option* ids = tok->add_flag("--ids", targs->ids, "Print one JSON array of ids");
  CLI::Option* pieces =
      tok->add_flag("--pieces", targs->pieces, "Print one line per token: id<TAB>piece");
  ids->excludes(pieces);
  tok->add_flag("--special", targs->special,
                "Parse special-token text (<s>, <|im_start|>...) as special tokens");
  tok->add_flag("--add-bos", targs->add_bos, "Prepend the BOS token (default: none)");
  tok->callback([targs, text] { run_tokenize(*targs, text->count() > 0); });

  auto dargs = std::make_shared<DetokenizeArgs>();
  CLI::App* detok = app.add_subcommand("detokenize", "Token ids to text with a model's tokenizer");
  detok->add_option("-m,--model", dargs->model, "Model or vocabulary .gguf")->required();
  detok->add_option("ids", dargs->ids,
                    "Token ids: integers, or one JSON array (\"[1, 2]\"); none: read stdin");
  detok->add_flag("--special", dargs->special, "Render control tokens (<s>, <|eot_id|>...)");
  detok->callback([dargs] { run_detokenize(*dargs); });
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const gguf::File file = gguf::File::open(path, gguf::LoadMode::Mmap);
  return Tokenizer::create(vocab_from_gguf(file));
}

}  // namespace encore::cli
