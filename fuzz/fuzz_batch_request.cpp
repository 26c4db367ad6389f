// libFuzzer target for `encore batch` lines and the server's request bodies
// (src/api: parse_batch_line, parse_server_request; untrusted). Every
// input must either parse or throw encore::Error; an accepted line must keep
// the request limits (the engine relies on them before its own checks), and
// peek_custom_id must agree with it. Error messages must be valid UTF-8
// (they are written into JSON results). Anything else (crash, sanitizer
// report, another exception, hang) is a bug: an exception that is not an
// encore::Error escapes and terminates the process, which libFuzzer reports.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "encore/error.h"
#include "encore/openai.h"
#include "encore/request.h"
#include "encore/settings.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

bool in(float v, float lo, float hi) { return v >= lo && v <= hi; }

void check_request(const encore::Request& r) {
  using namespace encore;
  const int prompts = !r.prompt.empty() + !r.prompt_ids.empty() + !r.messages.empty();
  check(prompts <= 1);
  check(r.prompt_ids.size() <= (size_t{1} << 20) && r.messages.size() <= 4096);
  for (TokenId id : r.prompt_ids) check(id >= 0);
  // Every setting of the table (settings.h) in its range: the parser's ranges are the table's.
  visit_settings(r, [](const settings::Setting& s, const auto& v) {
    if constexpr (std::is_arithmetic_v<std::remove_cvref_t<decltype(v)>>) {
      check(settings::allowed(s, static_cast<double>(v)));
    }
  });
  check(r.stop.size() <= kMaxStopStrings);
  for (const std::string& s : r.stop) check(!s.empty() && s.size() <= kMaxStopBytes);
  check(r.tenant.empty() && r.priority == 0 && r.resume.empty());
  const SamplingParams& p = r.sampling;
  for (const auto& [id, bias] : p.logit_bias) {
    check(id >= 0 && (in(bias, -100, 100) || bias == -INFINITY));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line(reinterpret_cast<const char*>(data), size);
  const std::optional<std::string> peeked = encore::api::peek_custom_id(line);
  try {
    const encore::api::BatchLine b = encore::api::parse_batch_line(line);
    check(peeked == b.custom_id);
    check_request(b.request);
  } catch (const encore::api::RequestError& e) {
    check(*e.what() != '\0');
    // dump() throws (and so crashes here) on bytes that are not UTF-8.
    (void)nlohmann::json({{"field", e.field()}, {"message", e.what()}}).dump();
  } catch (const encore::Error&) {
  }
  // The same bytes as an HTTP body to either completion endpoint.
  for (const auto endpoint :
       {encore::api::Endpoint::Completions, encore::api::Endpoint::ChatCompletions}) {
    try {
      const encore::api::ServerRequest s =
          encore::api::parse_server_request(encore::api::parse_json_body(line), endpoint);
      check_request(s.request);
      check(s.request.session.empty() || encore::valid_session_id(s.request.session));
      check(!s.include_usage || s.request.stream);
    } catch (const encore::api::RequestError& e) {
      check(*e.what() != '\0');
      (void)nlohmann::json({{"field", e.field()}, {"message", e.what()}}).dump();
    } catch (const encore::Error&) {
    }
  }
  return 0;
}
