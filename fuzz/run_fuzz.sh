#!/usr/bin/env bash
# Runs fuzz_gguf for SECONDS on a fresh corpus outside the repository:
# generated seeds plus the first 64 KiB of a few shared GGUF files (if the
# shared folder is there). Exits non-zero if the fuzzer finds a crash.
#
# usage: fuzz/run_fuzz.sh BUILD_DIR [SECONDS] [SHARED_DIR]
#   BUILD_DIR: configured with -DENCORE_BUILD_FUZZERS=ON -DCMAKE_CXX_COMPILER=clang++-14
set -euo pipefail

build=${1:?usage: run_fuzz.sh BUILD_DIR [SECONDS] [SHARED_DIR]}
seconds=${2:-60}
shared=${3:-$(cd "$(dirname "$0")/.." && pwd)/../shared}

ninja -C "$build" fuzz_gguf fuzz_gguf_seeds >/dev/null
bin="$build/bin"
[ -x "$bin/fuzz_gguf" ] || bin="$build/fuzz"

work=$(mktemp -d "${TMPDIR:-/tmp}/encore-fuzz-gguf.XXXXXX")
corpus="$work/corpus"
mkdir -p "$corpus" "$work/artifacts"
"$bin/fuzz_gguf_seeds" "$corpus"
for f in models/stories260K.gguf models/stories260K-ff192-q8_0.gguf \
         testdata/vocab/ggml-vocab-llama-spm.gguf testdata/vocab/ggml-vocab-gpt-2.gguf; do
  if [ -f "$shared/$f" ]; then head -c 65536 "$shared/$f" >"$corpus/$(basename "$f").head"; fi
done

echo "fuzz_gguf: corpus and crash artifacts in $work"
"$bin/fuzz_gguf" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 \
  -timeout=10 -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$corpus"
