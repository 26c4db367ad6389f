// The audit log's writer and chain check without a model (src/audit):
// lines chain across restarts and rotated files, a torn line is recovered,
// and each kind of damage is named at its line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "audit/line.h"
#include "cli_runner.h"
#include "encore/audit.h"
#include "encore/error.h"
#include "server/shadow.h"

namespace encore::audit {
namespace {

using test::read_file;
using test::read_lines;
using test::TempDir;
using test::write_lines;

// Writes `n` records "k": 0..n-1 through a fresh AuditLog.
void write_records(const AuditOptions& o, int first, int n) {
  auto log = AuditLog::open(o);
  for (int i = first; i < first + n; ++i) {
    Json j;
    j["type"] = "note";
    j["k"] = i;
    j["text"] = std::string(100, 'x');
    log->append(std::move(j));
  }
  log->flush();
}

TEST(AuditDigest, Sha256KnownVectors) {
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  // Ids hash as little-endian int32: {1} is the bytes 01 00 00 00.
  EXPECT_EQ(ids_sha256({1}), sha256_hex(std::string("\x01\0\0\0", 4)));
}

TEST(AuditLog, ChainsLinesAndContinuesAfterARestart) {
  TempDir tmp;
  AuditOptions o;
  o.path = tmp.file("a.log");
  write_records(o, 0, 3);
  write_records(o, 3, 2);  // a restart: a second start line, seq goes on
  const std::vector<std::string> lines = read_lines(o.path);
  ASSERT_EQ(lines.size(), 7u);  // start, 3, start, 2
  std::string prev = kGenesis;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string why;
    const std::optional<ParsedLine> p = parse_line(lines[i], &why);
    ASSERT_TRUE(p) << i << ": " << why;
    EXPECT_EQ(p->seq, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(p->prev, prev);
    prev = p->hash;
  }
  EXPECT_EQ(nlohmann::json::parse(lines[4])["type"], "start");
  const VerifyReport rep = verify({o.path});
  EXPECT_TRUE(rep.ok()) << rep.broken;
  EXPECT_EQ(rep.lines, 7);
  EXPECT_EQ(rep.head, prev);
}

TEST(AuditLog, RotatesBySizeAndVerifiesAcrossFilesInAnyOrder) {
  TempDir tmp;
  AuditOptions o;
  o.path = tmp.file("a.log");
  o.max_bytes = 1200;  // a few ~330-byte lines per file
  write_records(o, 0, 12);
  ASSERT_TRUE(std::filesystem::exists(o.path + ".1"));
  std::vector<std::string> files = {o.path};
  for (int n = 1; std::filesystem::exists(o.path + "." + std::to_string(n)); ++n) {
    files.push_back(o.path + "." + std::to_string(n));
    EXPECT_LE(std::filesystem::file_size(files.back()), 1200u);
  }
  ASSERT_GE(files.size(), 3u);
  const VerifyReport rep = verify(files);  // the live file first: order does not matter
  EXPECT_TRUE(rep.ok()) << rep.broken;
  EXPECT_EQ(rep.lines, 13);
  EXPECT_EQ(rep.files.back(), o.path);  // chain order puts the live file last

  // A rotated file missing is a gap: "deleted", at the first line after it.
  std::vector<std::string> without(files.begin(), files.end());
  without.erase(without.begin() + 2);  // a.log.2
  const VerifyReport gap = verify(without);
  EXPECT_FALSE(gap.ok());
  EXPECT_NE(gap.broken.find("deleted"), std::string::npos) << gap.broken;

  // Verifying only the live file: the chain starts past seq 1 (a note).
  const VerifyReport live = verify({o.path});
  EXPECT_TRUE(live.ok()) << live.broken;
  ASSERT_FALSE(live.notes.empty());
  EXPECT_NE(live.notes[0].find("starts at seq"), std::string::npos);
}

TEST(AuditLog, NamesEditedDeletedReorderedAndTornLines) {
  TempDir tmp;
  AuditOptions o;
  o.path = tmp.file("a.log");
  write_records(o, 0, 6);
  const std::vector<std::string> good = read_lines(o.path);
  ASSERT_EQ(good.size(), 7u);
  const std::string f = tmp.file("t.log");
  auto check = [&](const std::vector<std::string>& lines, const std::string& want_line,
                   const std::string& want_word) {
    write_lines(f, lines);
    const VerifyReport rep = verify({f});
    EXPECT_FALSE(rep.ok());
    EXPECT_NE(rep.broken.find(f + ":" + want_line + ":"), std::string::npos) << rep.broken;
    EXPECT_NE(rep.broken.find(want_word), std::string::npos) << rep.broken;
  };
  {  // one byte flipped inside line 3
    std::vector<std::string> l = good;
    l[2][l[2].find("\"k\":") + 4] ^= 1;
    check(l, "3", "edited");
  }
  {  // line 3 changed and its own hash recomputed: the next line's prev tells
    std::vector<std::string> l = good;
    const std::optional<ParsedLine> p = [&] {
      std::string why;
      return parse_line(l[2], &why);
    }();
    ASSERT_TRUE(p);
    Json rec = p->json;
    rec["k"] = 99;
    rec.erase("seq");
    rec.erase("prev");
    rec.erase("hash");
    std::string hash;
    std::string line = seal(p->seq, rec.dump(), p->prev, &hash);
    line.pop_back();
    l[2] = line;
    check(l, "4", "edited");
  }
  {  // line 4 deleted
    std::vector<std::string> l = good;
    l.erase(l.begin() + 3);
    check(l, "4", "deleted");
  }
  {  // lines 4 and 5 swapped
    std::vector<std::string> l = good;
    std::swap(l[3], l[4]);
    check(l, "4", "reordered");
  }
  {  // a torn last line (a crash while writing): a note, the chain holds
    std::string text = read_file(o.path);
    text.resize(text.size() - 40);
    std::ofstream(f, std::ios::binary | std::ios::trunc) << text;
    const VerifyReport rep = verify({f});
    EXPECT_TRUE(rep.ok()) << rep.broken;
    EXPECT_EQ(rep.lines, 6);
    ASSERT_EQ(rep.notes.size(), 1u);
    EXPECT_NE(rep.notes[0].find("torn"), std::string::npos);
  }
}

TEST(AuditLog, ATornLineIsRecoveredAtTheNextStart) {
  TempDir tmp;
  AuditOptions o;
  o.path = tmp.file("a.log");
  write_records(o, 0, 3);
  std::string text = read_file(o.path);
  text.resize(text.size() - 30);  // the last record torn by a "crash"
  std::ofstream(o.path, std::ios::binary | std::ios::trunc) << text;
  write_records(o, 3, 2);
  const std::vector<std::string> lines = read_lines(o.path);
  ASSERT_EQ(lines.size(), 8u);  // start, 2 good, torn, recover, start, 2
  EXPECT_EQ(nlohmann::json::parse(lines[4])["type"], "recover");
  const VerifyReport rep = verify({o.path});
  EXPECT_TRUE(rep.ok()) << rep.broken;
  EXPECT_EQ(rep.lines, 7);  // the torn line is not counted
  ASSERT_EQ(rep.notes.size(), 1u);
  EXPECT_NE(rep.notes[0].find("recovered"), std::string::npos) << rep.notes[0];

  // Without the recover line the same torn line is damage.
  std::vector<std::string> no_recover = lines;
  no_recover.erase(no_recover.begin() + 4);
  write_lines(o.path, no_recover);
  EXPECT_FALSE(verify({o.path}).ok());
}

// A crash right after a rotation leaves a new live file holding only a torn
// line: the chain goes on from the newest rotated file.
TEST(AuditLog, ACrashRightAfterARotationKeepsTheChain) {
  TempDir tmp;
  AuditOptions o;
  o.path = tmp.file("a.log");
  o.max_bytes = 1200;
  write_records(o, 0, 6);
  ASSERT_TRUE(std::filesystem::exists(o.path + ".1"));
  std::vector<std::string> files;
  for (int n = 1; std::filesystem::exists(o.path + "." + std::to_string(n)); ++n) {
    files.push_back(o.path + "." + std::to_string(n));
  }
  // The live file: only the first bytes of its first line.
  const std::string first = read_lines(o.path)[0];
  std::ofstream(o.path, std::ios::binary | std::ios::trunc) << first.substr(0, 40);
  files.push_back(o.path);
  const VerifyReport torn = verify(files);
  EXPECT_TRUE(torn.ok()) << torn.broken;
  write_records(o, 6, 2);
  const VerifyReport rep = verify(files);
  EXPECT_TRUE(rep.ok()) << rep.broken;
  EXPECT_EQ(rep.first_seq, 1);
  ASSERT_EQ(rep.notes.size(), 1u);
  EXPECT_NE(rep.notes[0].find("recovered"), std::string::npos) << rep.notes[0];
}

// A line cut just before its newline is whole: the next start ends it and
// goes on, with no recover line.
TEST(AuditLog, ALineMissingOnlyItsNewlineIsKept) {
  TempDir tmp;
  AuditOptions o;
  o.path = tmp.file("a.log");
  write_records(o, 0, 2);
  std::string text = read_file(o.path);
  text.pop_back();
  std::ofstream(o.path, std::ios::binary | std::ios::trunc) << text;
  write_records(o, 2, 1);
  const std::vector<std::string> lines = read_lines(o.path);
  ASSERT_EQ(lines.size(), 5u);  // start, 2, start, 1
  for (const std::string& l : lines) EXPECT_NE(nlohmann::json::parse(l)["type"], "recover");
  const VerifyReport rep = verify({o.path});
  EXPECT_TRUE(rep.ok()) << rep.broken;
  EXPECT_EQ(rep.lines, 5);
}

TEST(AuditLog, OneWriterPerFile) {
  TempDir tmp;
  AuditOptions o;
  o.path = tmp.file("a.log");
  auto first = AuditLog::open(o);
  EXPECT_THROW(AuditLog::open(o), InvalidArgument);
  EXPECT_THROW(first->append(Json::object()), InvalidArgument);
  EXPECT_THROW(first->append(Json::array({1})), InvalidArgument);
}

TEST(AuditLog, RefusesToContinueAnEditedLog) {
  TempDir tmp;
  AuditOptions o;
  o.path = tmp.file("a.log");
  write_records(o, 0, 2);
  std::vector<std::string> l = read_lines(o.path);
  l.back()[l.back().find("\"k\":") + 4] ^= 1;
  write_lines(o.path, l);
  try {
    write_records(o, 2, 1);
    FAIL() << "an edited log was continued";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("audit verify"), std::string::npos) << e.what();
  }
}

TEST(AuditLog, NotALogAndOversizedLinesAreBreaksNotCrashes) {
  TempDir tmp;
  const std::string f = tmp.file("x.log");
  std::ofstream(f, std::ios::binary) << "hello\n{\"seq\":1}\n";
  const VerifyReport rep = verify({f});
  EXPECT_FALSE(rep.ok());
  EXPECT_NE(rep.broken.find(f + ":1:"), std::string::npos) << rep.broken;
  // A line past kMaxLineBytes is a break, never held.
  std::ofstream(f, std::ios::binary | std::ios::trunc)
      << std::string(kMaxLineBytes + 10, '[') << "\n";
  const VerifyReport big = verify({f});
  EXPECT_FALSE(big.ok());
  EXPECT_NE(big.broken.find("longer than"), std::string::npos) << big.broken;
  // A sealed line nesting thousands of levels deep is refused, not recursed into.
  std::string hash;
  std::string deep =
      "{\"type\":\"request\",\"x\":" + std::string(5000, '[') + std::string(5000, ']') + "}";
  std::ofstream(f, std::ios::binary | std::ios::trunc) << seal(1, deep, kGenesis, &hash);
  const VerifyReport nested = verify({f});
  EXPECT_FALSE(nested.ok());
  EXPECT_NE(nested.broken.find("nests deeper"), std::string::npos) << nested.broken;
  EXPECT_THROW(verify({tmp.file("missing.log")}), InvalidArgument);
  EXPECT_EQ(fsync_from_name("always"), Fsync::Always);
  EXPECT_THROW(fsync_from_name("sometimes"), InvalidArgument);
}

// The consistency check's comparison finds a changed id, a missing token,
// another finish reason, another number of choices; equal outputs pass.
TEST(ConsistencyCheck, FindsEveryDifference) {
  Response served;
  served.samples.resize(2);
  served.samples[0].ids = {5, 6, 7};
  served.samples[1].ids = {5, 9};
  served.samples[1].finish = FinishReason::Stop;
  Response same = served;
  EXPECT_EQ(server::output_difference(served, same).first, "");
  Response changed = served;
  changed.samples[1].ids[1] = 8;
  const auto [reason, detail] = server::output_difference(served, changed);
  EXPECT_EQ(reason, "output");
  EXPECT_NE(detail.find("choice 1, token 1: served 9, check 8"), std::string::npos) << detail;
  Response shorter = served;
  shorter.samples[0].ids.pop_back();
  EXPECT_EQ(server::output_difference(served, shorter).first, "output");
  Response finish = served;
  finish.samples[1].finish = FinishReason::Length;
  EXPECT_EQ(server::output_difference(served, finish).first, "finish_reason");
  Response fewer = served;
  fewer.samples.pop_back();
  EXPECT_EQ(server::output_difference(served, fewer).first, "output");
}

}  // namespace
}  // namespace encore::audit
