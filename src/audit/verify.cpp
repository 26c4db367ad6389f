// audit::verify (include/encore/audit.h): the chain over one or more files,
// and, at the first broken link, why: a line changed (its own hash, or the
// next line's prev, no longer matches), lines missing (a gap in seq),
// lines out of order (a seq that went back, or a missing one found later),
// a file cut short.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "audit/line.h"
#include "encore/error.h"

namespace encore::audit {
namespace {

// The seq of a file's first audit line (a torn line left by a crash may
// come before it, then its recover line); nullopt when none of its first
// lines is one.
std::optional<int64_t> first_seq_of(const std::string& path) {
  LineReader reader(path);
  LineReader::Got got;
  for (int i = 0; i < 4 && reader.next(got); ++i) {
    if (!got.complete || got.too_long) continue;
    std::string why;
    if (const std::optional<ParsedLine> p = parse_line(got.text, &why)) return p->seq;
  }
  return std::nullopt;
}

struct Where {
  std::string file;
  int64_t line = 0;
  std::string text() const { return fmt::format("{}:{}", file, line); }
};

// After a gap at `gap_at` (seqs `lo`..`hi` missing), the rest of the files
// are read only for their seqs: a missing seq found later means the lines
// were reordered, not deleted.
std::string classify_gap(const std::vector<std::string>& files, size_t file_index,
                         int64_t from_line, int64_t lo, int64_t hi, const Where& gap_at,
                         int64_t before_seq, int64_t seq) {
  for (size_t f = file_index; f < files.size(); ++f) {
    LineReader reader(files[f]);
    LineReader::Got got;
    int64_t n = 0;
    while (reader.next(got)) {
      ++n;
      if (f == file_index && n <= from_line) continue;
      if (!got.complete || got.too_long) continue;
      std::string why;
      const std::optional<ParsedLine> p = parse_line(got.text, &why);
      if (p && p->seq >= lo && p->seq <= hi) {
        return fmt::format("{}: reordered: seq {} follows seq {}, and seq {} comes later, at {}:{}",
                           gap_at.text(), seq, before_seq, p->seq, files[f], n);
      }
    }
  }
  return fmt::format(
      "{}: deleted: seq {} follows seq {}: {} missing", gap_at.text(), seq, before_seq,
      lo == hi ? fmt::format("line seq {} is", lo) : fmt::format("lines seq {} to {} are", lo, hi));
}

}  // namespace

VerifyReport verify(const std::vector<std::string>& files,
                    const std::function<void(const Line&)>& each) {
  VerifyReport rep;
  // Chain order: by the first audit line's seq (a file with none among its
  // first lines, such as a new file holding only a torn line, goes last).
  std::vector<std::pair<int64_t, std::string>> order;
  for (const std::string& f : files)
    order.emplace_back(first_seq_of(f).value_or(std::numeric_limits<int64_t>::max()), f);
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [seq, f] : order) rep.files.push_back(f);

  bool have_prev = false;
  int64_t prev_seq = 0;
  std::string prev_hash;
  Where prev_at;
  // A line that is not an audit line, accepted only when the next one is a
  // "recover" line saying it was torn by a crash (bytes must match).
  struct Torn {
    Where at;
    uint64_t bytes = 0;
    std::string why;
  };
  std::optional<Torn> torn;
  auto broken = [&](std::string why) { rep.broken = std::move(why); };

  for (size_t fi = 0; fi < rep.files.size() && rep.ok(); ++fi) {
    const std::string& file = rep.files[fi];
    LineReader reader(file);
    LineReader::Got got;
    int64_t line_no = 0;
    while (rep.ok() && reader.next(got)) {
      ++line_no;
      const Where at{file, line_no};
      if (!got.complete) {
        const bool last = fi + 1 == rep.files.size();
        if (last && !torn) {
          rep.notes.push_back(fmt::format(
              "{}: the last line is torn ({} bytes, a crash while writing); the chain holds "
              "before it",
              at.text(), got.bytes));
        } else {
          broken(
              fmt::format("{}: truncated: the file ends in a torn line ({} bytes) but the "
                          "chain goes on in another file",
                          at.text(), got.bytes));
        }
        break;
      }
      if (got.too_long) {
        broken(
            fmt::format("{}: not an audit line: longer than {} bytes", at.text(), kMaxLineBytes));
        break;
      }
      std::string why;
      std::optional<ParsedLine> p = parse_line(got.text, &why);
      if (!p) {
        if (torn) {
          broken(fmt::format("{}: edited: {}", torn->at.text(), torn->why));
          break;
        }
        torn = Torn{at, got.bytes, why};
        continue;
      }
      if (torn) {
        const bool recovered = p->type == "recover" && p->json.contains("torn_bytes") &&
                               p->json["torn_bytes"].is_number_unsigned() &&
                               p->json["torn_bytes"].get<uint64_t>() == torn->bytes;
        if (!recovered) {
          broken(fmt::format("{}: edited: {}", torn->at.text(), torn->why));
          break;
        }
        rep.notes.push_back(fmt::format(
            "{}: a line torn by a crash ({} bytes); the writer recovered at the next line",
            torn->at.text(), torn->bytes));
        torn.reset();
      }
      if (!have_prev) {
        if (p->seq == 1 && p->prev != kGenesis) {
          broken(fmt::format("{}: edited: the first line's prev is not the genesis", at.text()));
          break;
        }
        if (p->seq > 1) {
          rep.notes.push_back(fmt::format(
              "{}: the chain starts at seq {} (earlier lines are in files not given); verified "
              "from there",
              at.text(), p->seq));
        }
        rep.first_seq = p->seq;
      } else if (p->seq == prev_seq + 1) {
        if (p->prev != prev_hash) {
          broken(
              fmt::format("{}: edited: its prev does not match the line before it ({}, seq "
                          "{}): that line was changed and rehashed, or replaced",
                          at.text(), prev_at.text(), prev_seq));
          break;
        }
      } else if (p->seq > prev_seq + 1) {
        broken(
            classify_gap(rep.files, fi, line_no, prev_seq + 1, p->seq - 1, at, prev_seq, p->seq));
        break;
      } else {
        broken(fmt::format("{}: reordered: seq {} follows seq {} ({})", at.text(), p->seq, prev_seq,
                           prev_at.text()));
        break;
      }
      have_prev = true;
      prev_seq = p->seq;
      prev_hash = p->hash;
      prev_at = at;
      ++rep.lines;
      rep.last_seq = p->seq;
      rep.head = p->hash;
      if (each) each(Line{file, line_no, p->seq, std::move(p->json)});
    }
    if (rep.ok() && torn) {
      broken(fmt::format("{}: edited: {}", torn->at.text(), torn->why));
    }
  }
  return rep;
}

}  // namespace encore::audit
