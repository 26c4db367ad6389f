#!/usr/bin/env bash
# The main job: set up, build, and generate text.
#   scripts/run.sh                      the demo model shipped in the repo,
#                                       models/stories260K.gguf (a tiny trained Llama: short
#                                       children's stories in English; models/README.md)
#   MODEL=path.gguf scripts/run.sh      your model
#   MODEL=synth scripts/run.sh          a small synthetic model with RANDOM weights (its text
#                                       is noise), made by `encore synth` into build/
#   scripts/run.sh -m path.gguf -p "Once upon a time" -n 64 --temp 0   (any `encore run` flags)
# Without -p/-f the prompt is "Once upon a time" (and -n 128 unless -n is given). Paths are
# relative to the repo root. DRY_RUN=1 prints the `encore run` command line (one argument a
# line) instead of setting up, building and running it (tests/cli_demo_test.cpp checks it).
set -euo pipefail
cd "$(dirname "$0")/.."

readonly DEMO_MODEL=models/stories260K.gguf
readonly SYNTH_MODEL=build/synth-tiny-q8_0.gguf
dry=0
[ "${DRY_RUN:-0}" = 0 ] || dry=1

args=("$@")
has_model=0
has_prompt=0
has_n=0
for a in "${args[@]}"; do
  case "$a" in
    -m|--model|--model=*) has_model=1 ;;
    -p|--prompt|-f|--file) has_prompt=1 ;;
    -n|--n-predict|--n-predict=*) has_n=1 ;;
  esac
done
synth=0
if [ $has_model -eq 0 ]; then
  MODEL="${MODEL:-$DEMO_MODEL}"
  if [ "$MODEL" = synth ]; then
    MODEL=$SYNTH_MODEL
    synth=1
    echo "run: MODEL=synth: a small synthetic model with RANDOM weights: its text is noise." >&2
  elif [ "$MODEL" = "$DEMO_MODEL" ] && [ ! -f "$MODEL" ]; then
    echo "run: $DEMO_MODEL is missing (it ships with the repo: git checkout -- $DEMO_MODEL);" \
      "or MODEL=path.gguf scripts/run.sh, or MODEL=synth for random weights" >&2
    exit 1
  fi
  args=(-m "$MODEL" "${args[@]}")
fi
if [ $has_prompt -eq 0 ]; then
  args+=(-p "Once upon a time")
  [ $has_n -eq 1 ] || args+=(-n 128)
fi
if [ $dry -eq 1 ]; then
  printf '%s\n' build/bin/encore run "${args[@]}"
  exit 0
fi

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DENCORE_BUILD_TESTS=OFF >/dev/null
cmake --build build --target encore
if [ $synth -eq 1 ] && [ ! -f "$SYNTH_MODEL" ]; then
  build/bin/encore synth -o "$SYNTH_MODEL" --preset tiny --type Q8_0 --seed 1
fi
exec build/bin/encore run "${args[@]}"
