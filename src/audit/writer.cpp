// AuditLog (include/encore/audit.h): one writer thread appends sealed lines
// to the live file, rotates it by size, makes it durable per Fsync, and
// retries a failed write (nothing is dropped while the process lives).
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "audit/line.h"
#include "encore/error.h"
#include "encore/version.h"

namespace encore::audit {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The highest N of the rotated files PATH.N (0: none).
int64_t last_rotation(const std::string& path) {
  const fs::path p(path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".";
  int64_t best = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string num = name.substr(prefix.size());
    if (num.size() > 12 || num.find_first_not_of("0123456789") != std::string::npos) continue;
    best = std::max<int64_t>(best, std::stoll(num));
  }
  return best;
}

// The end of a log file: its last complete line (parsed) and the bytes of
// a torn line after it.
struct Tail {
  std::optional<ParsedLine> last;
  uint64_t torn_bytes = 0;
  bool newline_only = false;  // the torn line is whole: only its "\n" is missing
};

Tail read_tail(const std::string& path) {
  Tail t;
  std::error_code ec;
  if (!fs::exists(path, ec)) return t;
  LineReader reader(path);
  LineReader::Got got;
  int64_t line_no = 0;
  std::string last_text;
  int64_t last_no = 0;
  while (reader.next(got)) {
    ++line_no;
    if (!got.complete) {
      std::string why;
      if (!got.too_long) {
        if (std::optional<ParsedLine> whole = parse_line(got.text, &why)) {
          t.last = std::move(whole);  // cut just before its newline
          t.newline_only = true;
          return t;
        }
      }
      t.torn_bytes = got.bytes;
      break;
    }
    if (got.too_long) {
      throw InvalidArgument(
          fmt::format("audit log {}: line {} is longer than {} bytes: not an "
                      "audit log (move it away to start a new one)",
                      path, line_no, kMaxLineBytes));
    }
    last_text = std::move(got.text);
    last_no = line_no;
  }
  if (last_no == 0) return t;
  std::string why;
  t.last = parse_line(last_text, &why);
  if (!t.last) {
    throw InvalidArgument(fmt::format(
        "audit log {}: its last complete line ({}) is not a valid audit line: {}; run `encore "
        "audit verify {}`, and move the file away to start a new log",
        path, last_no, why, path));
  }
  return t;
}

// A new or renamed name is durable once its directory is.
void sync_directory_of(const std::string& path) {
  const fs::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

struct AuditLog::Impl {
  AuditOptions opt;
  std::function<void(std::string_view)> log;
  int fd = -1;
  uint64_t file_bytes = 0;
  int64_t rotation = 0;  // the last PATH.N
  // Chain head; touched by open() and then only by the writer thread.
  int64_t seq = 0;
  std::string prev = kGenesis;

  mutable std::mutex mu;
  std::condition_variable cv;         // the writer waits for work
  std::condition_variable room;       // append() waits for queue room, flush() for progress
  std::deque<std::string> queue;      // serialized records
  int64_t appended = 0, written = 0;  // records
  int64_t synced = 0;                 // records durable (as fsync promises)
  WriterCounters counters;
  bool stopping = false;
  bool sync_wanted = false;  // flush() asks for durability now
  bool failing = false;      // a write failed and has not succeeded since
  Clock::time_point no_rotation_until{};
  std::thread writer;

  // Opens (creating) the live file, locked against a second writer. Throws
  // InvalidArgument; reopen() is the writer thread's form, which does not.
  void open_file() {
    fd = ::open(opt.path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) {
      throw InvalidArgument("audit_log", fmt::format("{}: cannot open for appending: {}", opt.path,
                                                     std::strerror(errno)));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      fd = -1;
      throw InvalidArgument("audit_log",
                            fmt::format("{}: another process writes this audit log (it is "
                                        "locked); give each process its own file",
                                        opt.path));
    }
    struct stat st {};
    file_bytes = fstat(fd, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
    sync_directory_of(opt.path);
  }
  bool reopen() {
    try {
      open_file();
      return true;
    } catch (const InvalidArgument& e) {
      if (log && !failing) log(fmt::format("audit log: {}", e.what()));
      return false;
    }
  }

  // Writes all of `bytes`, retrying each second while the disk refuses
  // (counted, said once per outage); false only when stopping gave up.
  bool write_all(std::string_view bytes) {
    int tries_at_stop = 0;
    while (!bytes.empty()) {
      if (fd < 0 && !reopen()) errno = EBADF;
      const ssize_t n = fd < 0 ? -1 : ::write(fd, bytes.data(), bytes.size());
      if (n > 0) {
        bytes.remove_prefix(static_cast<size_t>(n));
        file_bytes += static_cast<uint64_t>(n);
        if (failing) {
          failing = false;
          if (log) log(fmt::format("audit log {}: writing again", opt.path));
        }
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      const std::string err = n < 0 ? std::strerror(errno) : "wrote nothing";
      {
        std::lock_guard<std::mutex> lock(mu);
        ++counters.write_errors;
        if (stopping && ++tries_at_stop > 5) {
          if (log) {
            log(
                fmt::format("audit log {}: giving up at shutdown after write errors ({}): {} "
                            "queued lines are lost",
                            opt.path, err, queue.size() + 1));
          }
          return false;
        }
      }
      if (!failing && log) {
        log(
            fmt::format("audit log {}: write failed ({}); retrying every second, nothing is "
                        "dropped",
                        opt.path, err));
      }
      failing = true;
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
    return true;
  }

  // Renames the live file to PATH.N and opens a new one. A rename that
  // fails (said, counted) is tried again after a minute, not per line.
  void rotate() {
    if (Clock::now() < no_rotation_until) return;
    ::fdatasync(fd);
    ::close(fd);
    fd = -1;
    const std::string to = fmt::format("{}.{}", opt.path, rotation + 1);
    std::error_code ec;
    fs::rename(opt.path, to, ec);
    if (ec) {
      if (log) {
        log(fmt::format("audit log {}: cannot rotate to {}: {}; trying again in a minute", opt.path,
                        to, ec.message()));
      }
      no_rotation_until = Clock::now() + std::chrono::minutes(1);
      std::lock_guard<std::mutex> lock(mu);
      ++counters.write_errors;
    } else {
      ++rotation;
      std::lock_guard<std::mutex> lock(mu);
      ++counters.rotations;
    }
    reopen();  // on failure, write_all retries
  }

  void run() {
    auto last_sync = Clock::now();
    bool dirty = false;
    for (;;) {
      std::vector<std::string> batch;
      bool want_sync = false;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait_for(lock, std::chrono::seconds(1),
                    [&] { return stopping || sync_wanted || !queue.empty(); });
        want_sync = sync_wanted;
        sync_wanted = false;
        while (!queue.empty()) {
          batch.push_back(std::move(queue.front()));
          queue.pop_front();
        }
        if (batch.empty() && stopping) break;
      }
      std::string out;
      uint64_t batch_bytes = 0;
      bool ok = true;
      for (const std::string& record : batch) {
        batch_bytes += record.size();
        std::string hash;
        std::string line = seal(seq + 1, record, prev, &hash);
        if (line.size() > kMaxLineBytes) {
          // Readers refuse such a line: it is replaced by one that says so
          // (request_record redacts what would not fit, so this is a bug).
          Json big;
          big["type"] = "oversized";
          big["bytes"] = line.size();
          big["head"] = record.substr(0, 256);
          line = seal(seq + 1, big.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                      prev, &hash);
        }
        if (opt.max_bytes > 0 && file_bytes + out.size() > 0 &&
            file_bytes + out.size() + line.size() > opt.max_bytes) {
          ok = ok && write_all(out);
          out.clear();
          rotate();
        }
        ++seq;
        prev = std::move(hash);
        out += line;
      }
      if (!out.empty()) {
        ok = ok && write_all(out);
        dirty = true;
      }
      const auto now = Clock::now();
      if (dirty && (opt.fsync == Fsync::Always ||
                    (opt.fsync == Fsync::Interval &&
                     (now - last_sync >= std::chrono::seconds(1) || stopping || want_sync)))) {
        ::fdatasync(fd);
        last_sync = now;
        dirty = false;
      }
      std::lock_guard<std::mutex> lock(mu);
      written += static_cast<int64_t>(batch.size());
      counters.lines += ok ? static_cast<int64_t>(batch.size()) : 0;
      counters.bytes_pending -= static_cast<int64_t>(batch_bytes);
      if (!dirty || opt.fsync == Fsync::Never) synced = written;
      room.notify_all();
    }
    if (dirty && opt.fsync != Fsync::Never) ::fdatasync(fd);
    std::lock_guard<std::mutex> lock(mu);
    synced = written;
    room.notify_all();
  }

  // Waits up to kMaxQueueWait for room (the writer failing for that long):
  // then the record is dropped, counted and said, so that no request thread
  // hangs on a dead disk.
  void push(std::string record) {
    std::unique_lock<std::mutex> lock(mu);
    const bool room_now = room.wait_for(lock, kMaxQueueWait, [&] {
      return counters.bytes_pending < static_cast<int64_t>(kMaxQueueBytes) || stopping;
    });
    if (!room_now || stopping) {
      ++counters.dropped;
      if (log) {
        log(fmt::format("audit log {}: a record was dropped: {}", opt.path,
                        stopping ? "the log is closing" : "the writer is stuck (disk?)"));
      }
      return;
    }
    counters.bytes_pending += static_cast<int64_t>(record.size());
    queue.push_back(std::move(record));
    ++appended;
    cv.notify_one();
  }
};

std::unique_ptr<AuditLog> AuditLog::open(const AuditOptions& options,
                                         std::function<void(std::string_view)> log) {
  if (options.path.empty()) throw InvalidArgument("audit_log", "no path given");
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->log = std::move(log);
  impl->rotation = last_rotation(options.path);
  // The chain continues from the live file, or from the newest rotated one
  // when the live file is gone or empty (rotated just before a stop).
  Tail tail = read_tail(options.path);
  if (!tail.last && impl->rotation > 0) {  // a crash may tear the first line of a new file
    const std::string rotated = fmt::format("{}.{}", options.path, impl->rotation);
    const Tail before = read_tail(rotated);
    if (before.torn_bytes > 0 || before.newline_only) {
      throw InvalidArgument("audit_log", fmt::format("{} ends in a torn line; run `encore audit "
                                                     "verify` on it",
                                                     rotated));
    }
    tail.last = before.last;
  }
  if (tail.last) {
    impl->seq = tail.last->seq;
    impl->prev = tail.last->hash;
  }
  impl->open_file();
  if (tail.newline_only && !impl->write_all("\n")) {
    throw InvalidArgument("audit_log", "cannot write " + options.path);
  }
  if (tail.torn_bytes > 0) {
    // The torn bytes stay (evidence); the newline ends them, and the
    // "recover" line says how many there were, chained to the last good line.
    Json rec;
    rec["type"] = "recover";
    rec["time"] = utc_now();
    rec["torn_bytes"] = tail.torn_bytes;
    std::string hash;
    const std::string line = "\n" + seal(impl->seq + 1, rec.dump(), impl->prev, &hash);
    if (!impl->write_all(line)) throw InvalidArgument("audit_log", "cannot write " + options.path);
    ++impl->seq;
    impl->prev = hash;
    if (impl->log) {
      impl->log(
          fmt::format("audit log {}: its last line was torn ({} bytes, a crash while "
                      "writing); a recover line follows it",
                      options.path, tail.torn_bytes));
    }
  }
  Impl* raw = impl.get();
  impl->writer = std::thread([raw] { raw->run(); });
  std::unique_ptr<AuditLog> out(new AuditLog(options, std::move(impl)));
  Json start;
  start["type"] = "start";
  start["time"] = utc_now();
  start["engine_version"] = engine_version_string();
  start["build_id"] = build_id_string();
  start["redact"] = options.redact;
  start["fsync"] = fsync_name(options.fsync);
  out->append(std::move(start));
  return out;
}

AuditLog::AuditLog(const AuditOptions& options, std::unique_ptr<Impl> impl)
    : options_(options), impl_(std::move(impl)) {}

AuditLog::~AuditLog() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    impl_->cv.notify_all();
    impl_->room.notify_all();
  }
  impl_->writer.join();
  ::close(impl_->fd);
}

void AuditLog::append(Json record) {
  if (!record.is_object() || record.empty()) {
    throw InvalidArgument("audit_log", "a record must be a JSON object with members");
  }
  impl_->push(record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

bool AuditLog::flush(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  const int64_t target = impl_->appended;
  impl_->sync_wanted = true;
  impl_->cv.notify_one();
  return impl_->room.wait_for(lock, timeout, [&] { return impl_->synced >= target; });
}

WriterCounters AuditLog::counters() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->counters;
}

}  // namespace encore::audit
