// Tokenizer encode throughput (MB/s) per vocabulary.
//
// Every .gguf in ENCORE_SHARED_DIR/testdata/vocab plus models/stories260K.gguf
// encodes the same ~1 MiB of mixed text: English prose, C++ and Python code,
// Chinese and Japanese, and numbers, generated here from a fixed seed (so no
// large data file is committed and every run measures the same bytes). A
// vocabulary whose tokenizer cannot be built (e.g. an unsupported
// tokenizer.ggml.model) is skipped with a message on stderr.
//
//   build-bench/bin/bench_tokenizer [--benchmark_filter=qwen2] [--shared DIR]
//
// Counters: MB/s (10^6 bytes of input per second), tokens (per encode) and
// bytes/token (how much text one token covers: fewer, longer tokens mean less
// merge work per byte).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "encore/error.h"
#include "encore/gguf.h"
#include "encore/tokenizer.h"

namespace {

// SplitMix64: a tiny deterministic generator, so the text is the same on
// every machine and run.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  template <typename T, size_t N>
  const T& pick(const T (&a)[N]) {
    return a[below(N)];
  }

 private:
  uint64_t s_;
};

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

constexpr const char* kWords[] = {
    "the",      "a",       "little",    "girl",         "named",  "Lily",     "went",
    "to",       "park",    "and",       "saw",          "big",    "tree",     "with",
    "red",      "apples",  "she",       "wanted",       "climb",  "but",      "her",
    "mother",   "said",    "no",        "because",      "it",     "was",      "too",
    "high",     "so",      "they",      "sat",          "under",  "shade",    "ate",
    "sandwich", "model",   "inference", "reproducible", "output", "tokens",   "weights",
    "quickly",  "however", "therefore", "although",     "every",  "morning",  "river",
    "mountain", "city",    "language",  "computer",     "memory", "engineer", "results",
};
constexpr const char* kPunct[] = {".", ".", ".", ",", ",", "!", "?", ";", ":", " -"};

constexpr const char* kCode[] = {
    "for (int i = 0; i < n; ++i) {\n  sum += a[i] * b[i];\n}\n",
    "def encode(self, text: str) -> list[int]:\n    return [self.vocab[t] for t in "
    "self.split(text)]\n",
    "if (!file) throw std::runtime_error(\"cannot open \" + path);\n",
    "    const auto it = by_text_.find(text);\n    return it == by_text_.end() ? -1 : "
    "it->second;\n",
    "#include <vector>\n#include <string>\n\nnamespace encore {\n",
    "x = np.zeros((batch, seq_len, d_model), dtype=np.float32)  # [B, T, D]\n",
    "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id;\n",
    "\tif err != nil {\n\t\treturn nil, fmt.Errorf(\"read %s: %w\", path, err)\n\t}\n",
};

// Common CJK ideographs (U+4E00..U+9FFF) mixed with hiragana and CJK
// punctuation, in sentence-like runs.
void append_cjk(Rng& rng, std::string& out) {
  const size_t n = 8 + rng.below(40);
  for (size_t i = 0; i < n; ++i) {
    const size_t kind = rng.below(10);
    if (kind < 6) {
      append_utf8(out, 0x4E00 + static_cast<uint32_t>(rng.below(0x5200)));
    } else if (kind < 9) {
      append_utf8(out, 0x3041 + static_cast<uint32_t>(rng.below(0x56)));  // hiragana
    } else {
      append_utf8(out, rng.below(2) ? 0x3001 : 0xFF0C);  // 、 ，
    }
  }
  append_utf8(out, 0x3002);  // 。
  out += '\n';
}

void append_numbers(Rng& rng, std::string& out) {
  const size_t n = 3 + rng.below(10);
  for (size_t i = 0; i < n; ++i) {
    switch (rng.below(5)) {
      case 0:
        out += fmt::format("{}", rng.below(1000000));
        break;
      case 1:
        out += fmt::format("{}.{:02}", rng.below(10000), rng.below(100));
        break;
      case 2:
        out +=
            fmt::format("20{:02}-{:02}-{:02}", rng.below(30), 1 + rng.below(12), 1 + rng.below(28));
        break;
      case 3:
        out += fmt::format("{:.6e}", static_cast<double>(rng.next() % 100000) / 7.0);
        break;
      default:
        out += fmt::format("+1 ({:03}) {:03}-{:04}", rng.below(1000), rng.below(1000),
                           rng.below(10000));
        break;
    }
    out += rng.below(3) == 0 ? "\n" : ", ";
  }
  out += '\n';
}

void append_prose(Rng& rng, std::string& out) {
  const size_t sentences = 1 + rng.below(5);
  for (size_t s = 0; s < sentences; ++s) {
    const size_t words = 4 + rng.below(14);
    for (size_t w = 0; w < words; ++w) {
      std::string word = rng.pick(kWords);
      if (w == 0) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
      out += word;
      out += w + 1 == words ? rng.pick(kPunct) : " ";
    }
    out += ' ';
  }
  out += rng.below(4) == 0 ? "\n\n" : "\n";
}

// About `bytes` bytes (a little more: whole paragraphs) of mixed text:
// roughly 40% prose, 25% code, 20% CJK and 15% numbers by paragraph count.
std::string make_mixed_text(size_t bytes) {
  Rng rng(20240611);
  std::string out;
  out.reserve(bytes + 4096);
  while (out.size() < bytes) {
    const size_t kind = rng.below(20);
    if (kind < 8) {
      append_prose(rng, out);
    } else if (kind < 13) {
      out += rng.pick(kCode);
    } else if (kind < 17) {
      append_cjk(rng, out);
    } else {
      append_numbers(rng, out);
    }
  }
  return out;
}

void bm_encode(benchmark::State& state, const encore::Tokenizer* tok, const std::string* text) {
  encore::Tokenizer::EncodeOptions opt;  // plain text: no BOS, no special tokens
  size_t n_tokens = 0;
  for (auto _ : state) {
    const std::vector<encore::TokenId> ids = tok->encode(*text, opt);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text->size()));
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(text->size()) / 1e6,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] = static_cast<double>(n_tokens);
  state.counters["bytes/token"] =
      n_tokens == 0 ? 0.0 : static_cast<double>(text->size()) / static_cast<double>(n_tokens);
}

struct Loaded {
  std::string name;
  std::unique_ptr<encore::Tokenizer> tok;
};

// The vocabularies to measure, in name order; failures are reported, not
// fatal, so that one unsupported vocabulary does not hide the others.
std::vector<Loaded> load_all(const std::filesystem::path& shared) {
  std::vector<std::filesystem::path> files;
  const std::filesystem::path vocab_dir = shared / "testdata" / "vocab";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(vocab_dir, ec)) {
    if (e.path().extension() == ".gguf") files.push_back(e.path());
  }
  if (ec)
    fmt::print(stderr, "bench_tokenizer: cannot list {}: {}\n", vocab_dir.string(), ec.message());
  std::sort(files.begin(), files.end());
  files.push_back(shared / "models" / "stories260K.gguf");

  std::vector<Loaded> out;
  for (const auto& path : files) {
    std::string name = path.stem().string();
    if (name.starts_with("ggml-vocab-")) name.erase(0, 11);
    try {
      const encore::gguf::File f =
          encore::gguf::File::open(path.string(), encore::gguf::LoadMode::Mmap);
      out.push_back({name, encore::Tokenizer::create(encore::vocab_from_gguf(f))});
    } catch (const encore::Error& e) {
      fmt::print(stderr, "bench_tokenizer: skipping {}: {}\n", name, e.what());
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  // --shared DIR overrides the folder configured at build time; it is taken
  // out before Google Benchmark parses the remaining flags.
  std::filesystem::path shared = ENCORE_SHARED_DIR;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--shared" && i + 1 < argc) {
      shared = argv[++i];
    } else {
      args.push_back(argv[i]);
    }
  }
  int n_args = static_cast<int>(args.size());
  benchmark::Initialize(&n_args, args.data());

  const std::string text = make_mixed_text(1 << 20);
  const std::vector<Loaded> vocabs = load_all(shared);
  if (vocabs.empty()) {
    fmt::print(stderr, "bench_tokenizer: no vocabulary could be loaded from {}\n", shared.string());
    return 1;
  }
  fmt::print(stderr, "bench_tokenizer: {} bytes of mixed text, {} vocabularies\n", text.size(),
             vocabs.size());
  for (const Loaded& v : vocabs) {
    benchmark::RegisterBenchmark(("encode/" + v.name).c_str(), bm_encode, v.tok.get(), &text)
        ->Unit(benchmark::kMillisecond)
        ->MinTime(1.0);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
