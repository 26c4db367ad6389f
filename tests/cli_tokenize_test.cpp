// `encore tokenize`, `encore detokenize` and `encore run --chat/--special`
// end to end: special-token parsing on and off, output formats, round trips,
// chat prompts that tokenize exactly like their rendered text, and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "shared_data.h"

namespace encore::test {
namespace {

using Ids = std::vector<int>;

constexpr const char* kSpm = "testdata/vocab/ggml-vocab-llama-spm.gguf";
constexpr const char* kPhi3 = "testdata/vocab/ggml-vocab-phi-3.gguf";
constexpr const char* kQwen2 = "testdata/vocab/ggml-vocab-qwen2.gguf";
constexpr const char* kStories = "models/stories260K.gguf";

// `encore tokenize --ids ARGS...` as ids; fails the test on a non-zero exit.
Ids tokenize_ids(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"tokenize", "--ids"};
  all.insert(all.end(), args.begin(), args.end());
  const CliResult r = run_encore(all);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return {};
  return nlohmann::json::parse(r.out).get<Ids>();
}

bool contains(const Ids& ids, int id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); }

TEST(CliTokenize, SpecialTokenTextIsParsedOnlyWithSpecial) {
  ENCORE_SHARED_FILE(spm, kSpm);
  EXPECT_EQ(tokenize_ids({"-m", spm, "--special", "<s>"}), Ids({1}));
  EXPECT_EQ(tokenize_ids({"-m", spm, "--special", "</s>"}), Ids({2}));
  // Plain text: "▁<", "s", ">" (no control token).
  const Ids plain = tokenize_ids({"-m", spm, "<s>"});
  EXPECT_GT(plain.size(), 1u);
  EXPECT_FALSE(contains(plain, 1));
}

TEST(CliTokenize, Phi3ChatMarkersAreSpecialOnlyWithSpecial) {
  ENCORE_SHARED_FILE(phi3, kPhi3);
  const std::string text = "<|user|>\nHi<|end|>\n<|assistant|>\n";
  const Ids special = tokenize_ids({"-m", phi3, "--special", text});
  ASSERT_FALSE(special.empty());
  EXPECT_EQ(special.front(), 32010);      // <|user|>
  EXPECT_TRUE(contains(special, 32007));  // <|end|>
  EXPECT_TRUE(contains(special, 32001));  // <|assistant|>
  const Ids plain = tokenize_ids({"-m", phi3, text});
  for (int id : {32010, 32007, 32001}) EXPECT_FALSE(contains(plain, id)) << id;
}

TEST(CliTokenize, Qwen2ImStartIsSpecialOnlyWithSpecial) {
  ENCORE_SHARED_FILE(qwen2, kQwen2);
  const CliResult r =
      run_encore({"tokenize", "--ids", "-m", qwen2, "--special", "<|im_start|>user"});
  if (r.exit_code != 0 && r.err.find("not supported yet") != std::string::npos) {
    GTEST_SKIP() << "BPE tokenizer not built yet: " << r.err;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const Ids special = nlohmann::json::parse(r.out).get<Ids>();
  ASSERT_FALSE(special.empty());
  EXPECT_EQ(special.front(), 151644);
  EXPECT_FALSE(contains(tokenize_ids({"-m", qwen2, "<|im_start|>user"}), 151644));
}

TEST(CliTokenize, NoBosUnlessAsked) {
  ENCORE_SHARED_FILE(spm, kSpm);
  // The vocabulary's own test vector: "Hello world" -> "▁Hello", "▁world".
  EXPECT_EQ(tokenize_ids({"-m", spm, "Hello world"}), Ids({15043, 3186}));
  EXPECT_EQ(tokenize_ids({"-m", spm, "--add-bos", "Hello world"}), Ids({1, 15043, 3186}));
  EXPECT_EQ(tokenize_ids({"-m", spm, ""}), Ids());
}

TEST(CliTokenize, OutputFormats) {
  ENCORE_SHARED_FILE(spm, kSpm);
  CliResult r = run_encore({"tokenize", "-m", spm, "--add-bos", "Hello world"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "     1 -> '<s>'\n 15043 -> ' Hello'\n  3186 -> ' world'\n");
  r = run_encore({"tokenize", "-m", spm, "--pieces", "a\n"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // "▁a" and the byte token <0x0A>, escaped so that every token is one line.
  EXPECT_EQ(r.out, "263\t a\n13\t\\n\n");
  r = run_encore({"tokenize", "-m", spm, "--ids", "Hello world"});
  EXPECT_EQ(r.out, "[15043, 3186]\n");
}

TEST(CliTokenize, NonPrintableBytesAreEscaped) {
  ENCORE_SHARED_FILE(spm, kSpm);
  // A lone byte of a multi-byte character and a control character.
  const CliResult r = run_encore({"tokenize", "-m", spm, "--pieces", "\xE2\x82\xAC\x01"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("\\x01"), std::string::npos) << r.out;
  for (char c : r.out) EXPECT_TRUE(c == '\n' || c == '\t' || c >= 0x20 || c < 0) << r.out;
}

TEST(CliTokenize, ReadsAFile) {
  ENCORE_SHARED_FILE(spm, kSpm);
  TempDir tmp;
  {
    std::ofstream f(tmp.file("in.txt"), std::ios::binary);
    f << "Hello world";
  }
  EXPECT_EQ(tokenize_ids({"-m", spm, "-f", tmp.file("in.txt")}), Ids({15043, 3186}));
}

TEST(CliTokenize, Errors) {
  ENCORE_SHARED_FILE(spm, kSpm);
  CliResult r = run_encore({"tokenize", "-m", spm});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("give the text as an argument or with -f FILE"), std::string::npos) << r.err;
  r = run_encore({"tokenize", "-m", spm, "-f", "/nonexistent/x.txt"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot open"), std::string::npos) << r.err;
  r = run_encore({"tokenize", "-m", spm, "--ids", "--pieces", "x"});
  EXPECT_NE(r.exit_code, 0);
  r = run_encore({"tokenize", "-m", "/nonexistent/model.gguf", "x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
}

TEST(CliDetokenize, RoundTripsAndAcceptsBothIdForms) {
  ENCORE_SHARED_FILE(spm, kSpm);
  const std::string text = "Hello world, \xE4\xBD\xA0\xE5\xA5\xBD!\n  indented";
  const Ids ids = tokenize_ids({"-m", spm, text});
  const std::string array = nlohmann::json(ids).dump();
  CliResult r = run_encore({"detokenize", "-m", spm, array});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, text + "\n");
  std::vector<std::string> args = {"detokenize", "-m", spm};
  for (int id : ids) args.push_back(std::to_string(id));
  r = run_encore(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, text + "\n");
}

TEST(CliDetokenize, ControlTokensOnlyWithSpecial) {
  ENCORE_SHARED_FILE(spm, kSpm);
  CliResult r = run_encore({"detokenize", "-m", spm, "[1, 15043, 2]"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "Hello\n");
  r = run_encore({"detokenize", "-m", spm, "--special", "[1, 15043, 2]"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "<s> Hello</s>\n");
}

TEST(CliDetokenize, Errors) {
  ENCORE_SHARED_FILE(spm, kSpm);
  CliResult r = run_encore({"detokenize", "-m", spm, "1", "32000"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("token id 32000 (position 1) is outside the vocabulary"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("0..31999"), std::string::npos) << r.err;
  r = run_encore({"detokenize", "-m", spm, "[1, -3]"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("token id -3"), std::string::npos) << r.err;
  r = run_encore({"detokenize", "-m", spm, "12x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("'12x' is not a token id"), std::string::npos) << r.err;
  r = run_encore({"detokenize", "-m", spm, "[1, \"a\"]"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("is not a token id"), std::string::npos) << r.err;
  r = run_encore({"detokenize", "-m", spm, "[1,"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("not a JSON array of token ids"), std::string::npos) << r.err;
}

// ---------------------------------------------------------------------------
// encore run --chat / --special

nlohmann::json run_json(std::vector<std::string> args) {
  std::vector<std::string> all = {"run", "--json", "--temp", "0", "-n", "4", "-c", "256"};
  all.insert(all.end(), args.begin(), args.end());
  const CliResult r = run_encore(all);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return nlohmann::json::object();
  return nlohmann::json::parse(r.out);
}

TEST(CliRunChat, ChatTemplateOverrideRendersThePrompt) {
  ENCORE_SHARED_FILE(model, kStories);
  const nlohmann::json j = run_json({"-m", model, "--chat-template", "chatml", "-p", "Hi"});
  EXPECT_EQ(j["chat_template"], "chatml");
  // The model's BOS, then the rendered text tokenized with special tokens on.
  EXPECT_EQ(j["prompt_ids"].get<Ids>(),
            tokenize_ids({"-m", model, "--special", "--add-bos",
                          "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"}));
}

TEST(CliRunChat, SystemMessageGoesFirst) {
  ENCORE_SHARED_FILE(model, kStories);
  const nlohmann::json j =
      run_json({"-m", model, "--chat-template", "llama2", "--system", "Be brief.", "-p", "Hi"});
  EXPECT_EQ(j["prompt_ids"].get<Ids>(),
            tokenize_ids({"-m", model, "--special", "--add-bos",
                          "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]"}));
}

// Message content is plain text: "</s>" in -p is the letters, while the
// template's own EOS between turns would be the control token.
TEST(CliRunChat, SpecialTokenTextInTheMessageIsPlainText) {
  ENCORE_SHARED_FILE(model, kStories);
  const nlohmann::json j =
      run_json({"-m", model, "--chat-template", "llama2", "-p", "Hi </s><s>[INST] x"});
  const Ids ids = j["prompt_ids"].get<Ids>();
  EXPECT_EQ(ids, tokenize_ids({"-m", model, "--add-bos", "[INST] Hi </s><s>[INST] x [/INST]"}));
  EXPECT_FALSE(contains(ids, 2));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 1);
  // --parse-special is for plain prompts only: with a chat flag it is an error.
  for (const char* chat : {"--chat", "--chat-template", "--system"}) {
    std::vector<std::string> args = {"run", "-m", model, "-p", "Hi", "-n", "1", "--parse-special",
                                     chat};
    if (std::string(chat) != "--chat") args.push_back("llama2");
    const CliResult r = run_encore(args);
    EXPECT_NE(r.exit_code, 0) << chat << ": " << r.err;
    EXPECT_NE(r.err.find("excludes"), std::string::npos) << r.err;
  }
}

TEST(CliRunChat, TemplateFromTheModelFile) {
  ENCORE_SHARED_FILE(phi3, kPhi3);
  TempDir tmp;
  const std::string model = tmp.file("phi3-tiny.gguf");
  // synth copies every tokenizer.* key, tokenizer.chat_template included.
  const CliResult s = run_encore({"synth", "-o", model, "--vocab-from", phi3, "--type", "Q8_0"});
  ASSERT_EQ(s.exit_code, 0) << s.err;
  const CliResult r = run_encore(
      {"run", "-m", model, "--chat", "-p", "Hi", "--json", "--temp", "0", "-n", "2", "-c", "64"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The model's own Jinja template (tests/cli_chat_template_test.cpp).
  EXPECT_NE(r.err.find("chat: Jinja template from tokenizer.chat_template"), std::string::npos)
      << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["chat_template"], "model");
  // Tokenized with the synthetic model's own metadata (its general.name is not
  // Phi-3's, so the Phi-3 whitespace stripping does not apply).
  const Ids rendered =
      tokenize_ids({"-m", model, "--special", "--add-bos", "<|user|>\nHi<|end|>\n<|assistant|>\n"});
  EXPECT_EQ(j["prompt_ids"].get<Ids>(), rendered);
  ASSERT_GE(rendered.size(), 3u);
  EXPECT_EQ(rendered[0], 1);               // one BOS, from add_bos
  EXPECT_EQ(rendered[1], 32010);           // <|user|>
  EXPECT_TRUE(contains(rendered, 32001));  // <|assistant|>
}

TEST(CliRunChat, Errors) {
  ENCORE_SHARED_FILE(model, kStories);
  CliResult r = run_encore({"run", "-m", model, "--chat", "-p", "Hi", "-n", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("has no tokenizer.chat_template"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("pass --chat-template NAME"), std::string::npos) << r.err;
  r = run_encore({"run", "-m", model, "--chat-template", "nope", "-p", "Hi", "-n", "1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown chat template name 'nope' (known: chatml"), std::string::npos)
      << r.err;
}

TEST(CliRunSpecial, PromptSpecialTextOnlyWithSpecialAndNeverTwoBos) {
  ENCORE_SHARED_FILE(model, kStories);
  const Ids plain = run_json({"-m", model, "-p", "<s>Once"})["prompt_ids"].get<Ids>();
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 1);  // only the added BOS
  EXPECT_GT(plain.size(), 2u);
  // --parse-special, or its older name --special.
  for (const char* flag : {"--parse-special", "--special"}) {
    const CliResult r = run_encore({"run", "--json", "--temp", "0", "-n", "2", "-c", "64", "-m",
                                    model, flag, "-p", "<s>Once"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const Ids special = nlohmann::json::parse(r.out)["prompt_ids"].get<Ids>();
    EXPECT_EQ(special, tokenize_ids({"-m", model, "--special", "<s>Once"}));
    EXPECT_EQ(std::count(special.begin(), special.end(), 1), 1) << "double BOS";
    EXPECT_NE(r.err.find("not adding a second BOS"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace encore::test
