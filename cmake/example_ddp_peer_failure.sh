#!/usr/bin/env bash
# example_ddp_peer_failure.sh - ctest example_fashion_mnist_ddp_peer_failure: rank 1 of a 3-rank
# DDP job (int8, a periodic snapshot every 10 steps) SIGKILLs itself in the middle of step 17. The
# survivors must name it, rank 0 (the lowest survivor) must write the snapshot of the last completed
# step (16), and a 2-rank job must resume from it (no per-rank state in it, said so).
#   example_ddp_peer_failure.sh <fashion_mnist_ddp> <data dir> <work dir> <mpiexec> [flags...]
# mpiexec must be OpenMPI's (--enable-recovery keeps the survivors running after the kill).
set -uo pipefail
exe="$1" data="$2" work="$3"
shift 3
mpiexec=("$@")
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work"
mkdir -p "$work"
args=(--data "$data" --epochs 1 --train-limit 3072 --test-limit 256 --batch 32 --seed 5 --compression int8
      --snapshot-dir "$work/snaps" --snapshot-every 10)
# Rank 1 SIGKILLs itself in the middle of step 17 (TRAINKIT_EXAMPLE_KILL, the example's fault
# injection): the last completed step is 16, the newest periodic snapshot 10.
TRAINKIT_EXAMPLE_KILL="1 17" TRAINKIT_DIST_TIMEOUT_MS=2000 "${mpiexec[@]}" --enable-recovery -np 3 "$exe" "${args[@]}" \
  >"$work/failed.log" 2>&1
periodic=$(ls "$work/snaps" | sed -n 's/^snapshot-0*\([0-9][0-9]*\)\.tks$/\1/p' | sort -n | sed -n '1p')
cat "$work/failed.log"
grep -q "rank 0: .*rank 1 (host .*) did not answer" "$work/failed.log" || fail "rank 0 did not name rank 1"
grep -q "rank 2: .*rank 1 (host .*) did not answer" "$work/failed.log" || fail "rank 2 did not name rank 1"
line=$(grep "resumable_run: rank 0 wrote the snapshot of step" "$work/failed.log") || fail "rank 0 wrote no snapshot after the failure"
step=$(sed -n 's/.*snapshot of step \([0-9]*\) after.*/\1/p' <<<"$line")
[[ "$periodic" == 10 && "$step" == 16 ]] || fail "expected the periodic snapshot of step 10 and the survivor's of step 16, got $periodic and $step"
"${mpiexec[@]}" -np 2 "$exe" "${args[@]}" --resume 1 >"$work/resumed.log" 2>&1 || { cat "$work/resumed.log"; fail "the resume on 2 ranks failed"; }
cat "$work/resumed.log"
grep -q "holds no per-rank state" "$work/resumed.log" || fail "the resume did not say the per-rank state was dropped"
grep -q "at step $step" "$work/resumed.log" || fail "the resume did not start at step $step"
echo "PASS: rank 1 killed in step 17; rank 0 wrote step $step (the periodic one: $periodic); resumed on 2 ranks"
