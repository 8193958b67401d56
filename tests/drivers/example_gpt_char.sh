#!/usr/bin/env bash
# example_gpt_char_smoke: the GPT example on Debian's fortunes-min corpus, as a user runs it.
#  1. One process, a small model for 60 steps in bf16 with recomputation inside every block: exit
#     0, a validation loss below 3.3 nats/char (a uniform guess over ~90 characters is 4.5; 60
#     steps reach about 2.6-2.9), a generated sample, the done line.
#  2. A head count that does not divide the width: exit 1 with a message naming both, no crash.
#  3. With a launcher (mpirun -np 2 ...): 2 data-parallel ranks for 30 steps; the same job stopped
#     after 15 steps (snapshot, exit 75) and resumed ends with the same parameters digest.
# Usage: example_gpt_char.sh <gpt_char or gpt_char_cuda executable> <work dir> [launcher...]
# Exit 77 (skipped) without the corpus, or when the executable says so (gpt_char_cuda without a GPU).
set -u
exe=$1 work=$2
shift 2
[ -r /usr/share/games/fortunes/fortunes ] || { echo "SKIPPED: fortunes-min not installed"; exit 77; }
small=(--eval-every 30 --layers 2 --embd 64 --heads 4 --context 32 --batch 16 --lr 0.003)
out=$("$exe" --steps 60 "${small[@]}" --precision bf16 --checkpoint every:1 --sample-chars 80); rc=$?
[ "$rc" = 77 ] && { printf '%s\n' "$out"; exit 77; }  # the CUDA build without a GPU
[ "$rc" = 0 ] || { echo "gpt_char failed (exit $rc): $out"; exit 1; }
printf '%s\n' "$out"
loss=$(printf '%s\n' "$out" | sed -n 's/.*val loss \([0-9.]*\) nats.*/\1/p' | tail -1)
[ -n "$loss" ] || { echo "FAIL: no validation loss line"; exit 1; }
awk -v l="$loss" 'BEGIN { exit !(l < 3.3) }' || { echo "FAIL: validation loss $loss nats/char after 60 steps (want < 3.3)"; exit 1; }
printf '%s\n' "$out" | grep -q '^sample:' || { echo "FAIL: no sample"; exit 1; }
printf '%s\n' "$out" | grep -q '^done  parameters digest' || { echo "FAIL: no done line"; exit 1; }
err=$("$exe" --steps 1 --embd 30 --heads 4 2>&1); rc=$?
[ "$rc" = 1 ] && printf '%s' "$err" | grep -q "embed_dim must be a positive multiple of num_heads" \
  || { echo "FAIL: --embd 30 --heads 4 gave rc $rc: $err"; exit 1; }
echo "ok: one process, validation loss $loss nats/char; a bad --heads is named"
[ $# -gt 0 ] || exit 0

rm -rf "$work" && mkdir -p "$work"
two=(--steps 30 "${small[@]}" --sample-chars 0 --dropout 0.1)
full=$("$@" "$exe" "${two[@]}" 2>&1) || { echo "FAIL: 2 ranks: $full"; exit 1; }
printf '%s\n' "$full" | grep -q "2 rank(s)" || { echo "FAIL: not 2 ranks: $full"; exit 1; }
want=$(printf '%s\n' "$full" | sed -n 's/^done  parameters digest //p')
"$@" "$exe" "${two[@]}" --snapshot-dir "$work/s" --stop-after 15 > "$work/first.log" 2>&1; rc=$?
[ "$rc" = 75 ] || { echo "FAIL: the stopped run exited $rc (want 75)"; cat "$work/first.log"; exit 1; }
second=$("$@" "$exe" "${two[@]}" --snapshot-dir "$work/s" --resume 1 2>&1) || { echo "FAIL: resume: $second"; exit 1; }
got=$(printf '%s\n' "$second" | sed -n 's/^done  parameters digest //p')
[ -n "$want" ] && [ "$got" = "$want" ] || { echo "FAIL: resumed digest '$got', uninterrupted '$want'"; printf '%s\n' "$second"; exit 1; }
echo "ok: 2 ranks, stopped at step 15 and resumed: digest $got as uninterrupted"
