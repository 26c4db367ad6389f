#include "server/http_reader.h"

#include <fmt/format.h>

#include <boost/asio/buffer.hpp>
#include <boost/beast/http/basic_parser.hpp>
#include <boost/beast/http/error.hpp>

namespace encore::server {
namespace {

namespace http = boost::beast::http;

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

// Beast's parser with our own storage: fields are counted as they are parsed
// (the limit stops the parse at the first field too many, trailers
// included, so a head of tiny fields cannot build a large table), the head is
// kept as plain strings, and the body is not reserved from a declared length.
class RequestReader::Parser final : public http::basic_parser<true> {
 public:
  explicit Parser(size_t max_fields) : max_fields_(max_fields) {}
  RequestHead head;
  std::string body;
  size_t field_bytes = 0;  // what the stored fields hold
  bool too_many_fields = false;

 private:
  using sv = boost::beast::string_view;
  void on_request_impl(http::verb, sv method, sv target, int version,
                       boost::beast::error_code&) override {
    head.method.assign(method.data(), method.size());
    head.target.assign(target.data(), target.size());
    head.version = version;
  }
  void on_response_impl(int, sv, int, boost::beast::error_code&) override {}
  void on_field_impl(http::field, sv name, sv value, boost::beast::error_code& ec) override {
    if (++fields_ > max_fields_) {
      too_many_fields = true;
      ec = http::error::header_limit;
      return;
    }
    if (head_done_) return;  // a trailer: counted, not kept
    head.fields.emplace_back(std::string(name.data(), name.size()),
                             std::string(value.data(), value.size()));
    field_bytes += name.size() + value.size() + 2 * sizeof(std::string);
  }
  void on_header_impl(boost::beast::error_code&) override { head_done_ = true; }
  void on_body_init_impl(const boost::optional<uint64_t>&, boost::beast::error_code&) override {}
  size_t on_body_impl(sv data, boost::beast::error_code&) override {
    body.append(data.data(), data.size());
    return data.size();
  }
  void on_chunk_header_impl(uint64_t, sv, boost::beast::error_code&) override {}
  size_t on_chunk_body_impl(uint64_t, sv data, boost::beast::error_code&) override {
    body.append(data.data(), data.size());
    return data.size();
  }
  void on_finish_impl(boost::beast::error_code&) override {}

  size_t max_fields_;
  size_t fields_ = 0;
  bool head_done_ = false;
};

std::string RequestHead::header(std::string_view name) const {
  for (const auto& [k, v] : fields) {
    if (iequals(k, name)) return v;
  }
  return {};
}

size_t RequestHead::header_count(std::string_view name) const {
  size_t n = 0;
  for (const auto& field : fields) n += iequals(field.first, name) ? 1 : 0;
  return n;
}

RequestReader::RequestReader(const HttpLimits& limits, std::string leftover)
    : parser_(std::make_unique<Parser>(limits.max_header_fields)),
      limits_(limits),
      pending_(std::move(leftover)) {
  parser_->header_limit(static_cast<uint32_t>(limits_.max_header_bytes));
  parser_->body_limit(static_cast<uint64_t>(limits_.max_body_bytes));
  parser_->eager(false);  // stop after the head: the caller decides before the body
  started_ = !pending_.empty();
}

RequestReader::~RequestReader() = default;

RequestReader::State RequestReader::feed(std::string_view bytes) {
  if (state_ == State::Done || state_ == State::Failed) return state_;
  if (!bytes.empty()) {
    started_ = true;
    pending_.append(bytes);
  }
  state_ = State::NeedMore;
  return parse();
}

RequestReader::State RequestReader::fail(int status, std::string message) {
  failure_ = {status, std::move(message)};
  pending_.clear();
  return state_ = State::Failed;
}

RequestReader::State RequestReader::parse() {
  Parser& p = *parser_;
  size_t off = 0;
  while (state_ == State::NeedMore && off < pending_.size() && !p.is_done()) {
    boost::beast::error_code ec;
    const size_t used =
        p.put(boost::asio::buffer(pending_.data() + off, pending_.size() - off), ec);
    off += used;
    if (ec == http::error::need_more) break;
    if (ec == http::error::header_limit && p.too_many_fields) {
      return fail(431, fmt::format("more than {} header fields", limits_.max_header_fields));
    }
    if (ec == http::error::header_limit) {
      return fail(431, fmt::format("the request line and headers exceed {} bytes",
                                   limits_.max_header_bytes));
    }
    if (ec == http::error::body_limit) {
      return fail(413, fmt::format("the body exceeds {} bytes", limits_.max_body_bytes));
    }
    if (ec == http::error::bad_content_length || ec == http::error::bad_transfer_encoding) {
      return fail(400, "conflicting or invalid Content-Length / Transfer-Encoding");
    }
    if (ec == http::error::bad_version) return fail(505, "only HTTP/1.0 and HTTP/1.1 are served");
    if (ec) return fail(400, fmt::format("malformed request ({})", ec.message()));
    if (!head_done_ && p.is_header_done()) {
      head_done_ = true;
      pending_.erase(0, off);
      return check_head();
    }
    if (used == 0) break;
  }
  pending_.erase(0, off);
  if (p.is_done()) return state_ = State::Done;
  // Beast refuses a head past its limit by itself; in the body only a chunk
  // header or the trailer is ever left unparsed, and they are short.
  if (head_done_ && pending_.size() > limits_.max_header_bytes) {
    return fail(400, "a chunk header or trailer is too long");
  }
  return state_;
}

RequestReader::State RequestReader::check_head() {
  head_ = std::move(parser_->head);
  head_.path = head_.target.substr(0, head_.target.find('?'));
  if (head_.version != 10 && head_.version != 11) {
    return fail(505, "only HTTP/1.0 and HTTP/1.1 are served");
  }
  size_t n_length = 0, n_encoding = 0, n_host = 0, n_auth = 0;
  for (const auto& [name, value] : head_.fields) {
    if (iequals(name, "Content-Length")) {
      ++n_length;
      // Beast takes "5, 5" and repeated equal values; a proxy in front may
      // frame the message differently, so only one plain number is taken.
      if (value.find(',') != std::string::npos) {
        return fail(400, "Content-Length must be one number");
      }
    } else if (iequals(name, "Transfer-Encoding")) {
      ++n_encoding;
      if (!iequals(trim_ows(value), "chunked")) {
        return fail(501, "only Transfer-Encoding: chunked is supported");
      }
    } else if (iequals(name, "Host")) {
      ++n_host;
    } else if (iequals(name, "Authorization")) {
      ++n_auth;  // a proxy in front might take another one than we would
    } else if (iequals(name, "Expect")) {
      if (!iequals(trim_ows(value), "100-continue")) return fail(417, "only Expect: 100-continue");
      head_.expect_continue = head_.version == 11;  // HTTP/1.0 has no 100 Continue
    }
  }
  if (n_length > 1) return fail(400, "Content-Length is given more than once");
  if (n_encoding > 1) return fail(400, "Transfer-Encoding is given more than once");
  if (n_auth > 1) return fail(400, "Authorization is given more than once");
  if (n_encoding > 0 && head_.version == 10) {
    return fail(400, "Transfer-Encoding is not allowed in an HTTP/1.0 request");
  }
  if (n_host > 1 || (n_host == 0 && head_.version == 11)) {
    return fail(400, "an HTTP/1.1 request needs exactly one Host header");
  }
  head_.keep_alive = parser_->keep_alive();
  head_.chunked = parser_->chunked();
  if (const auto len = parser_->content_length()) head_.content_length = *len;
  parser_->eager(true);
  return state_ = State::HeadReady;
}

void RequestReader::limit_body(size_t max_bytes) {
  if (state_ != State::HeadReady) return;
  if (head_.content_length && *head_.content_length > max_bytes) {
    fail(413, fmt::format("the body exceeds {} bytes", max_bytes));
    return;
  }
  limits_.max_body_bytes = max_bytes;
  parser_->body_limit(static_cast<uint64_t>(max_bytes));
}

std::string RequestReader::take_body() { return std::move(parser_->body); }

std::string RequestReader::take_leftover() { return std::move(pending_); }

size_t RequestReader::held_bytes() const {
  return pending_.capacity() + parser_->body.capacity() + parser_->field_bytes;
}

}  // namespace encore::server
