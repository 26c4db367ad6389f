// Stop strings across token boundaries (src/engine/stop_text.h): what is
// returned, what is held back, the earliest match, flush_shown() and restore().
#include "engine/output/stop_text.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "encore/error.h"

namespace encore {
namespace {

// Pushes pieces until a match; returns everything returned, and whether it matched.
std::pair<std::string, bool> feed(StopText& st, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) {
    const StopText::Push r = st.push(p);
    out += r.text;
    if (r.matched) return {out, true};
  }
  return {out, false};
}

TEST(StopText, NoStopStringsReturnEverythingAtOnce) {
  StopText st;
  const StopText::Push r = st.push("Hello");
  EXPECT_EQ(r.text, "Hello");
  EXPECT_FALSE(r.matched);
  EXPECT_EQ(st.held(), "");
}

TEST(StopText, MatchAcrossPieces) {
  StopText st({"llo"});
  StopText::Push r = st.push("Hel");
  EXPECT_EQ(r.text, "He");  // "l" may begin "llo"
  EXPECT_FALSE(r.matched);
  EXPECT_EQ(st.held(), "l");
  r = st.push("lo");
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(st.held(), "");

  StopText w({"world"});
  EXPECT_EQ(feed(w, {"Hello ", "wo", "r", "ld", "!"}), std::make_pair(std::string("Hello "), true));
}

TEST(StopText, TextBeforeTheMatchIsReturnedAndTheRestDropped) {
  StopText st({"STOP"});
  const StopText::Push r = st.push("abcSTOPdef");
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.text, "abc");
  StopText held({"STOP"});
  EXPECT_EQ(held.push("xyST").text, "xy");
  const StopText::Push m = held.push("OP tail");
  EXPECT_TRUE(m.matched);
  EXPECT_EQ(m.text, "");
}

TEST(StopText, HeldTextIsReleasedWhenItCanNoLongerMatch) {
  StopText st({"abc"});
  EXPECT_EQ(st.push("xa").text, "x");
  EXPECT_EQ(st.held(), "a");
  EXPECT_EQ(st.push("b").text, "");
  EXPECT_EQ(st.held(), "ab");
  const StopText::Push r = st.push("x");
  EXPECT_FALSE(r.matched);
  EXPECT_EQ(r.text, "abx");
  EXPECT_EQ(st.held(), "");
  // Overlapping prefix: "aaa" cannot match "aab" at 0 but may at 1.
  StopText o({"aab"});
  EXPECT_EQ(o.push("aa").text, "");
  EXPECT_EQ(o.push("a").text, "a");
  EXPECT_EQ(o.held(), "aa");
  const StopText::Push m = o.push("b");
  EXPECT_TRUE(m.matched);
  EXPECT_EQ(m.text, "");
}

TEST(StopText, HeldTextIsBoundedByTheLongestStop) {
  StopText st({"abcd", "xy"});
  EXPECT_EQ(st.push("zzzzabc").text, "zzzz");
  EXPECT_EQ(st.held(), "abc");  // at most the longest stop minus one
  EXPECT_EQ(st.push("x").text, "abc");
  EXPECT_EQ(st.held(), "x");
}

TEST(StopText, SeveralStopsEarliestMatchWins) {
  for (const std::vector<std::string>& stops :
       {std::vector<std::string>{"world", "lo w"}, std::vector<std::string>{"lo w", "world"}}) {
    StopText st(stops);
    const StopText::Push r = st.push("Hello world");
    EXPECT_TRUE(r.matched);
    EXPECT_EQ(r.text, "Hel");
  }
  // Across pieces: both complete in the same push, the earlier start wins.
  StopText st({"cde", "bcd"});
  EXPECT_EQ(st.push("ab").text, "a");
  const StopText::Push r = st.push("cdef");
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.text, "");
  // A stop that completes first ends the text even if a longer one began earlier.
  StopText lo({"abcx", "bc"});
  EXPECT_EQ(feed(lo, {"a", "b", "c", "x"}), std::make_pair(std::string("a"), true));
}

TEST(StopText, FlushShownThenContinueMatching) {
  StopText st({"END"});
  EXPECT_EQ(st.push("abE").text, "ab");
  EXPECT_EQ(st.flush_shown(), "E");
  EXPECT_EQ(st.held(), "E");  // shown but still held for matching
  EXPECT_EQ(st.shown(), 1u);
  EXPECT_EQ(st.flush_shown(), "");  // never returned twice
  StopText::Push r = st.push("N");
  EXPECT_FALSE(r.matched);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(st.flush_shown(), "N");
  r = st.push("D more");
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.text, "");  // "EN" was shown already; the match cuts the rest

  // No match after a flush: only the bytes not yet shown are returned.
  StopText nm({"END"});
  EXPECT_EQ(nm.push("abE").text, "ab");
  EXPECT_EQ(nm.flush_shown(), "E");
  r = nm.push("xy");
  EXPECT_FALSE(r.matched);
  EXPECT_EQ(r.text, "xy");
  EXPECT_EQ(nm.held(), "");
  EXPECT_EQ(nm.shown(), 0u);

  // A flushed prefix followed by new bytes that stay held.
  StopText part({"ENDX"});
  EXPECT_EQ(part.push("E").text, "");
  EXPECT_EQ(part.flush_shown(), "E");
  r = part.push("EN");  // "EEN": "E" can no longer start a match, "EN" can
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(part.held(), "EN");
  EXPECT_EQ(part.shown(), 0u);
  EXPECT_EQ(part.flush_shown(), "EN");
  r = part.push("Dq");
  EXPECT_EQ(r.text, "Dq");
  EXPECT_FALSE(r.matched);
}

TEST(StopText, RestoreValidatesAndResumes) {
  StopText st({"END"});
  EXPECT_THROW(st.restore("ab", 3), InvalidArgument);
  st.restore("EN", 2);
  EXPECT_EQ(st.held(), "EN");
  EXPECT_EQ(st.shown(), 2u);
  StopText::Push r = st.push("D");
  EXPECT_TRUE(r.matched);
  EXPECT_EQ(r.text, "");

  StopText again({"END"});
  again.restore("E", 0);
  r = again.push("x");
  EXPECT_FALSE(r.matched);
  EXPECT_EQ(r.text, "Ex");
  again.restore("", 0);
  EXPECT_EQ(again.held(), "");
}

}  // namespace
}  // namespace encore
