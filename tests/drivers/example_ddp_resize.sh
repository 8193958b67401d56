#!/usr/bin/env bash
# example_ddp_resize.sh - ctest example_fashion_mnist_ddp_resize: the DDP example with 1-bit
# compression (error feedback) stops after K steps on N ranks (--stop-after: snapshot, exit 75) and
# resumes on M ranks (--resume 1, --compression given as "1bit", recorded as "sign_1bit"), for
# N -> M = 2 -> 1, 2 -> 3, 3 -> 2. Each resume must say it redistributed the per-rank state, go on
# at the learning rate and sample position where the stop left it (the schedule counts samples),
# end with exit 0, and end at the step the global sample position gives:
#   K + floor(floor((samples - K N B) / M) / B)      (B samples per rank and step, drop_last)
# - the epoch goes on from the samples N ranks consumed, no fewer, no more.
#   example_ddp_resize.sh <fashion_mnist_ddp> <data dir> <work dir> <mpiexec> [mpiexec flags...]
set -uo pipefail
exe="$1" data="$2" work="$3"
shift 3
mpiexec=("$@")
samples=1536 batch=32 k=8
fail() { echo "FAIL: $*"; exit 1; }
for pair in "2 1" "2 3" "3 2"; do
  read -r n m <<<"$pair"
  dir="$work/resize-$n-$m"
  rm -rf "$dir"
  mkdir -p "$dir"
  args=(--data "$data" --epochs 1 --train-limit "$samples" --test-limit 256 --batch "$batch" --seed 3
        --snapshot-dir "$dir/snaps" --snapshot-every 0)
  "${mpiexec[@]}" -np "$n" "$exe" "${args[@]}" --compression sign_1bit --stop-after "$k" >"$dir/first.log" 2>&1
  rc=$?
  [[ $rc == 75 ]] || { cat "$dir/first.log"; fail "$n ranks, --stop-after $k: exit $rc, expected 75"; }
  "${mpiexec[@]}" -np "$m" "$exe" "${args[@]}" --compression 1bit --resume 1 >"$dir/second.log" 2>&1
  rc=$?
  [[ $rc == 0 ]] || { cat "$dir/second.log"; fail "$n -> $m ranks: the resumed run exited $rc"; }
  grep -q "at step $k (written by $n ranks, now $m: per-rank state redistributed)" "$dir/second.log" ||
    { cat "$dir/second.log"; fail "$n -> $m ranks: no 'written by $n ranks, now $m' line"; }
  grep -q "test accuracy" "$dir/second.log" || { cat "$dir/second.log"; fail "$n -> $m: no epoch line"; }
  stopped=$(sed -n 's/^stopped: learning rate \(.*\) of .*/\1/p' "$dir/first.log")
  resumed=$(sed -n 's/^resumed: learning rate \(.*\) of .*/\1/p' "$dir/second.log")
  [[ -n "$stopped" && "$stopped" == "$resumed" && "$stopped" == *" at sample $((k * n * batch))" ]] ||
    fail "$n -> $m ranks: stopped at '$stopped', resumed at '$resumed' (learning rate at sample $((k * n * batch)) both)"
  expect=$((k + (samples - k * n * batch) / m / batch))
  last=$(ls "$dir/snaps" | sed -n 's/^snapshot-0*\([0-9][0-9]*\)\.tks$/\1/p' | sort -n | tail -1)
  [[ "$last" == "$expect" ]] || fail "$n -> $m ranks: the run ended at step $last, the global sample position gives $expect"
  echo "$n -> $m ranks: stopped at step $k, resumed with learning rate $resumed, ended at step $last as expected"
done
echo "PASS"
