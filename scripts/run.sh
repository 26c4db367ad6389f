#!/usr/bin/env bash
# The main job: set up, build, and generate text.
#   scripts/run.sh                      synthetic tiny model (random weights)
#   MODEL=path.gguf scripts/run.sh      your model
#   scripts/run.sh -m path.gguf -p "Once upon a time" -n 64 --temp 0   (any `encore run` flags)
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DENCORE_BUILD_TESTS=OFF >/dev/null
cmake --build build --target encore

args=("$@")
has_model=0
for a in "${args[@]}"; do
  case "$a" in -m|--model|--model=*) has_model=1 ;; esac
done
if [ $has_model -eq 0 ]; then
  if [ -z "${MODEL:-}" ]; then
    MODEL=build/synth-tiny-q8_0.gguf
    echo "run: no MODEL given; making a small synthetic model with RANDOM weights: its text is noise."
    echo "run: for real text: MODEL=../shared/models/stories260K.gguf scripts/run.sh"
    [ -f "$MODEL" ] || build/bin/encore synth -o "$MODEL" --preset tiny --type Q8_0 --seed 1
  fi
  args=(-m "$MODEL" "${args[@]}")
fi
has_prompt=0
for a in "${args[@]}"; do
  case "$a" in -p|--prompt|-f|--file) has_prompt=1 ;; esac
done
[ $has_prompt -eq 1 ] || args+=(-p "Once upon a time" -n 128)
exec build/bin/encore run "${args[@]}"
