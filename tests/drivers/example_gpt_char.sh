#!/usr/bin/env bash
# example_gpt_char_smoke: the GPT example on Debian's fortunes-min corpus, as a user runs it - a small
# model for 60 steps in bf16 with recomputation inside every block. It must exit 0, report a
# validation loss below ln(vocabulary) by a margin (a uniform guess over ~90 characters is 4.5
# nats/char; 60 steps reach about 2.6-2.9), generate a sample, and name a bad flag value.
# Usage: example_gpt_char.sh <gpt_char executable>
set -u
exe=$1
[ -r /usr/share/games/fortunes/fortunes ] || { echo "SKIPPED: fortunes-min not installed"; exit 77; }
out=$("$exe" --steps 60 --eval-every 30 --layers 2 --embd 64 --heads 4 --context 32 --batch 16 --lr 0.003 \
  --precision bf16 --checkpoint every:1 --sample-chars 80) || { echo "gpt_char failed: $out"; exit 1; }
printf '%s\n' "$out"
loss=$(printf '%s\n' "$out" | sed -n 's/.*val loss \([0-9.]*\) nats.*/\1/p' | tail -1)
[ -n "$loss" ] || { echo "FAIL: no validation loss line"; exit 1; }
awk -v l="$loss" 'BEGIN { exit !(l < 3.3) }' || { echo "FAIL: validation loss $loss nats/char after 60 steps (want < 3.3)"; exit 1; }
printf '%s\n' "$out" | grep -q '^sample:' || { echo "FAIL: no sample"; exit 1; }
printf '%s\n' "$out" | grep -q '^done  parameters digest' || { echo "FAIL: no done line"; exit 1; }
# A head count that does not divide the width is an error naming both, exit 1, no crash.
err=$("$exe" --steps 1 --embd 30 --heads 4 2>&1); rc=$?
[ "$rc" = 1 ] && printf '%s' "$err" | grep -q "embed_dim must be a positive multiple of num_heads" \
  || { echo "FAIL: --embd 30 --heads 4 gave rc $rc: $err"; exit 1; }
echo "ok: validation loss $loss nats/char"
