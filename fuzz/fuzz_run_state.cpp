// libFuzzer target for the `--resume` state file parser (untrusted JSON).
// Every input must either parse or throw encore::InvalidArgument; a state
// that parses must survive save_run_state + load_run_state unchanged (the
// ids, counters and texts compare equal). Anything else (crash, sanitizer
// report, another exception, hang) is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "encore/error.h"
#include "encore/run_state.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  encore::RunState s;
  try {
    s = encore::parse_run_state(text, "fuzz");
  } catch (const encore::InvalidArgument&) {
    return 0;
  }
  const std::string path = "/tmp/encore-fuzz-run-state-" + std::to_string(getpid()) + ".json";
  encore::save_run_state(path, s);
  const encore::RunState back = encore::load_run_state(path);
  std::remove(path.c_str());
  const encore::Request &a = s.request, &b = back.request;
  check(b.prompt_ids == a.prompt_ids && back.n_ctx == s.n_ctx && b.seed == a.seed);
  check(back.system_fingerprint == s.system_fingerprint);
  check(b.resume.size() == a.resume.size());
  for (size_t i = 0; i < a.resume.size(); ++i) {
    check(b.resume[i].ids == a.resume[i].ids);
    check(b.resume[i].sampler.t == a.resume[i].sampler.t);
    check(b.resume[i].sampler.recent == a.resume[i].sampler.recent);
    check(b.resume[i].held_text == a.resume[i].held_text);
    check(b.resume[i].decoder_pending == a.resume[i].decoder_pending);
    check(b.resume[i].decoder_strip_pending == a.resume[i].decoder_strip_pending);
    check(b.resume[i].finished == a.resume[i].finished);
  }
  check(b.stop == a.stop && b.logprobs == a.logprobs && b.n == a.n);
  check(b.ignore_eos == a.ignore_eos);
  check(b.sampling.logit_bias == a.sampling.logit_bias);
  check(b.sampling.order == a.sampling.order);
  return 0;
}
