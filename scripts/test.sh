#!/usr/bin/env bash
# Every test: set up, build (Release), run the whole ctest suite (labels unit,
# invariance,
# data, cli and heavy: the 1b synth preset in every type), then the unit tests
# again under ASan+UBSan, then the GGUF and tokenizer fuzzers for a bounded time.
#   SHARED_DIR=/path/to/shared scripts/test.sh   (default: ../shared beside the repo)
#   FUZZ_SECONDS=60 (0 skips the fuzzer)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
shared="${SHARED_DIR:-$root/../shared}"
jobs="${JOBS:-$(nproc)}"
fuzz_seconds="${FUZZ_SECONDS:-60}"

bash scripts/setup.sh

echo "== clang-format (.clang-format) on every C++ file"
if ! git ls-files '*.cpp' '*.h' | xargs clang-format-14 --dry-run -Werror; then
  echo "clang-format: the files above differ; run: git ls-files '*.cpp' '*.h' | xargs clang-format-14 -i"
  exit 1
fi

echo "== Release build and full test suite (data: $shared)"
# ENCORE_BUILD_TESTS=ON undoes scripts/run.sh's OFF in the shared build folder.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DENCORE_BUILD_TESTS=ON \
  -DENCORE_SHARED_DIR="$shared" >/dev/null
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900 --no-tests=error

echo "== ASan+UBSan build, unit tests"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DENCORE_SANITIZE=ON \
  -DENCORE_SHARED_DIR="$shared" >/dev/null
cmake --build build-asan -j "$jobs"
ctest --test-dir build-asan --output-on-failure -j "$jobs" -L unit --timeout 900 --no-tests=error

if [ "$fuzz_seconds" != "0" ]; then
  echo "== libFuzzer: GGUF reader for ${fuzz_seconds}s"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DENCORE_BUILD_FUZZERS=ON \
    -DCMAKE_CXX_COMPILER=clang++-14 >/dev/null
  cmake --build build-fuzz -j "$jobs" --target fuzz_gguf fuzz_tokenizer fuzz_run_state \
    fuzz_batch_request fuzz_snapshot fuzz_snapshot_seeds fuzz_http_reader fuzz_audit fuzz_jinja \
    fuzz_panel_file
  bash fuzz/run_fuzz.sh build-fuzz "$fuzz_seconds" "$shared"
  echo "== libFuzzer: tokenizer for $((fuzz_seconds / 2))s"
  tok_corpus=$(mktemp -d "${TMPDIR:-/tmp}/encore-fuzz-tok.XXXXXX")
  build-fuzz/bin/fuzz_tokenizer -max_total_time=$((fuzz_seconds / 2)) -max_len=4096 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$tok_corpus/" "$tok_corpus"
  echo "== libFuzzer: --resume state files for $((fuzz_seconds / 4))s"
  state_corpus=$(mktemp -d "${TMPDIR:-/tmp}/encore-fuzz-state.XXXXXX")
  # Seed: a real state with two samples, a stop string and a logit bias.
  build/bin/encore run -m "$shared/models/stories260K.gguf" -p "Tom" -n 6 --n 2 --seed 3 \
    --stop "ab" --logit-bias 5-inf --save-state "$state_corpus/seed.json" >/dev/null 2>&1
  build-fuzz/bin/fuzz_run_state -max_total_time=$((fuzz_seconds / 4)) -max_len=8192 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$state_corpus/" "$state_corpus"
  echo "== libFuzzer: encore batch lines for $((fuzz_seconds / 4))s"
  batch_corpus=$(mktemp -d "${TMPDIR:-/tmp}/encore-fuzz-batch.XXXXXX")
  # Seeds, one line per file: both envelope styles, every field, a few bad values.
  split -l 1 - "$batch_corpus/seed-" <<'SEEDS'
{"custom_id": "c1", "prompt": "Once upon", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "min_p": 0.1, "typical_p": 0.8, "top_k": 12, "repeat_penalty": 1.3, "repeat_last_n": -1, "presence_penalty": 0.25, "frequency_penalty": -0.5, "seed": 18446744073709551615, "n": 3, "stop": ["\n", "The end"], "ignore_eos": true, "samplers": "top_k;temperature", "logit_bias": {"15043": 2.5, "7": -100}, "logprobs": 4, "stream": true, "model": "m", "user": "u"}
{"custom_id": "c2", "messages": [{"role": "system", "content": "Be terse."}, {"role": "user", "name": "b", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url", "image_url": {"url": "x"}}]}], "max_completion_tokens": 9, "logprobs": true, "top_logprobs": 20, "seed": -1}
{"custom_id": "c3", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": null, "stop": "x"}}
{"custom_id": "c4", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 15043, 2147483647], "temperature": 1e300}}
{"prompt": ["one"], "max_tokens": 3.0, "seed": 1e400, "logit_bias": {"01": 1}, "n": 65}
SEEDS
  build-fuzz/bin/fuzz_batch_request -max_total_time=$((fuzz_seconds / 4)) -max_len=8192 \
    -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$batch_corpus/" "$batch_corpus"
  echo "== libFuzzer: state store records for $((fuzz_seconds / 4))s"
  snap_corpus=$(mktemp -d "${TMPDIR:-/tmp}/encore-fuzz-snap.XXXXXX")
  # Seeds: real records, compressed, uncompressed and empty.
  build-fuzz/bin/fuzz_snapshot_seeds "$snap_corpus"
  build-fuzz/bin/fuzz_snapshot -max_total_time=$((fuzz_seconds / 4)) -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$snap_corpus/" "$snap_corpus"
  echo "== libFuzzer: HTTP requests of encore serve for $((fuzz_seconds / 4))s"
  http_corpus=$(mktemp -d "${TMPDIR:-/tmp}/encore-fuzz-http.XXXXXX")
  # Seeds: the first byte picks the read size and body limit; then requests.
  printf '\x05GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.0\r\n\r\n' \
    >"$http_corpus/get"
  printf '\x10POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{"a":1}' \
    >"$http_corpus/length"
  printf '\x47POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n4;x=y\r\n{"a"\r\n3\r\n:1}\r\n0\r\nT: v\r\n\r\nGET / HTTP/1.1\r\nHost: y\r\n\r\n' \
    >"$http_corpus/chunked"
  printf '\x01POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n{}' \
    >"$http_corpus/dup"
  build-fuzz/bin/fuzz_http_reader -max_total_time=$((fuzz_seconds / 4)) -max_len=4096 \
    -timeout=10 -rss_limit_mb=2048 -artifact_prefix="$http_corpus/" "$http_corpus"
  echo "== libFuzzer: audit logs (encore audit verify, encore replay) for $((fuzz_seconds / 4))s"
  audit_corpus=$(mktemp -d "${TMPDIR:-/tmp}/encore-fuzz-audit.XXXXXX")
  # Seeds: a real log (a completion with n = 2, stop, logprobs; a refused
  # line), raw (first byte 0) and to be sealed (first byte 1).
  printf '%s\n' '{"custom_id":"a","url":"/v1/completions","body":{"prompt":"Tom","max_tokens":6,"n":2,"stop":["x"],"logprobs":1,"seed":4}}' \
    '{"custom_id":"b","url":"/v1/completions","body":{"prompt":"Tom","max_tokens":"x"}}' \
    >"$audit_corpus/requests.jsonl"
  build/bin/encore batch -m "$shared/models/stories260K.gguf" -i "$audit_corpus/requests.jsonl" \
    -o "$audit_corpus/out" --audit-log "$audit_corpus/log" >/dev/null 2>&1
  { printf '\x00'; cat "$audit_corpus/log"; } >"$audit_corpus/raw"
  { printf '\x01'; cat "$audit_corpus/log"; } >"$audit_corpus/sealed"
  rm "$audit_corpus/log" "$audit_corpus/requests.jsonl" "$audit_corpus/out"
  build-fuzz/bin/fuzz_audit -max_total_time=$((fuzz_seconds / 4)) -max_len=16384 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$audit_corpus/" "$audit_corpus"
  echo "== libFuzzer: chat templates for $((fuzz_seconds / 4))s"
  jinja_corpus=$(mktemp -d "${TMPDIR:-/tmp}/encore-fuzz-jinja.XXXXXX")
  # Seeds: the real chat templates (shared data) and the synthetic edge cases.
  if [ -d "$shared/testdata/chat_templates" ]; then
    cp "$shared"/testdata/chat_templates/*.jinja "$jinja_corpus/"
  fi
  for f in tests/jinja/cases/*.jinja; do cp "$f" "$jinja_corpus/case-$(basename "$f")"; done
  build-fuzz/bin/fuzz_jinja -max_total_time=$((fuzz_seconds / 4)) -max_len=65536 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$jinja_corpus/" "$jinja_corpus"
  echo "== libFuzzer: panel cache file headers for $((fuzz_seconds / 4))s"
  panel_corpus=$(mktemp -d "${TMPDIR:-/tmp}/encore-fuzz-panel.XXXXXX")
  # Seed: the header of a real panel file (a tiny Q8_0 model opened with --mmap).
  build/bin/encore synth --preset tiny --type Q8_0 -o "$panel_corpus/m.gguf" >/dev/null 2>&1
  XDG_CACHE_HOME="$panel_corpus/cache" build/bin/encore run -m "$panel_corpus/m.gguf" --mmap \
    -p a -n 1 >/dev/null 2>&1
  for f in "$panel_corpus"/cache/encore/panels/*.panels; do head -c 8192 "$f" >"$panel_corpus/seed"; done
  rm -r "$panel_corpus/m.gguf" "$panel_corpus/cache"
  build-fuzz/bin/fuzz_panel_file -max_total_time=$((fuzz_seconds / 4)) -max_len=16384 -timeout=10 \
    -rss_limit_mb=2048 -artifact_prefix="$panel_corpus/" "$panel_corpus"
fi

# ctest stops the script on any failure (set -e), so reaching here means all passed.
count() { ctest --test-dir "$1" -N "${@:2}" | sed -n 's/^Total Tests: //p'; }
n=$(( $(count build) + $(count build-asan -L unit) ))
echo "== all test stages passed"
echo "tests: $n passed, 0 failed"
