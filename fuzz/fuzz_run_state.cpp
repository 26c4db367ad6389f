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

#include "cli/run_state.h"
#include "encore/error.h"

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  encore::cli::RunState s;
  try {
    s = encore::cli::parse_run_state(text, "fuzz");
  } catch (const encore::InvalidArgument&) {
    return 0;
  }
  const std::string path = "/tmp/encore-fuzz-run-state-" + std::to_string(getpid()) + ".json";
  encore::cli::save_run_state(path, s);
  const encore::cli::RunState back = encore::cli::load_run_state(path);
  std::remove(path.c_str());
  check(back.prompt_ids == s.prompt_ids && back.n_ctx == s.n_ctx &&
        back.params.seed == s.params.seed);
  check(back.system_fingerprint == s.system_fingerprint);
  check(back.samples.size() == s.samples.size());
  for (size_t i = 0; i < s.samples.size(); ++i) {
    check(back.samples[i].ids == s.samples[i].ids);
    check(back.samples[i].sampler.t == s.samples[i].sampler.t);
    check(back.samples[i].sampler.recent == s.samples[i].sampler.recent);
    check(back.samples[i].held_text == s.samples[i].held_text);
    check(back.samples[i].decoder.pending == s.samples[i].decoder.pending);
    check(back.samples[i].finished == s.samples[i].finished);
  }
  check(back.params.stop == s.params.stop && back.params.logprobs == s.params.logprobs);
  check(back.params.sampling.logit_bias == s.params.sampling.logit_bias);
  check(back.params.sampling.order == s.params.sampling.order);
  return 0;
}
