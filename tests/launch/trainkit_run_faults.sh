#!/usr/bin/env bash
# trainkit_run_faults.sh - ctest launch_trainkit_run_faults: a 3-rank fashion_mnist_ddp job started
# by tools/trainkit-run (on Open MPI's mpirun), with faults from outside the program, as a user
# would meet them. For each fault it checks what the survivors say, the snapshot, the exit status
# the shell sees, the time the job took to end, and that no process of the job is left.
#   kill   SIGKILL of rank 1 after the first periodic snapshot: both survivors name rank 1 with its
#          host and pid (and no other rank), rank 0 writes the last completed step, status 75 within
#          the timeout + 5 s; then 2 ranks resume from that snapshot (3 steps, then --stop-after: 75).
#   stop   SIGSTOP of rank 1: the same, and the stalled rank does not hang the job.
#   error  rank 0's own error (its snapshot directory cannot be made): its message first, the job
#          ends within 5 s with status 1.
#   term   SIGTERM sent straight to every rank while they start (as Slurm does): a snapshot and 75;
#          and SIGTERM to trainkit-run itself mid-run: passed to the ranks, snapshot, 75.
#   missing  a program that does not exist: every rank says so, status 127.
#   trainkit_run_faults.sh <trainkit-run> <fashion_mnist_ddp> <data dir> <work dir> [launcher flags...]
set -uo pipefail
run="$1" exe="$2" data="$3" work="$4"
shift 4
launcher_flags=("$@")
# shellcheck source=tests/launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # timeout_ms, fail, now; a fresh $work
secs() { python3 -c "print(f'{$2 - $1:.1f}')"; }
base=(--data "$data" --epochs 2 --train-limit 6000 --test-limit 256 --batch 16 --seed 5 --snapshot-every 5)

# start <case> [flags]: the job in the background; sets job (trainkit-run's pid) and log.
start() {
  local c="$1"
  shift
  log="$work/$c.log"
  mkdir -p "$work/$c"
  "$run" "${launcher_flags[@]}" -n 3 -- "$exe" "${base[@]}" --snapshot-dir "$work/$c/snaps" "$@" >"$log" 2>&1 &
  job=$!
}
# pid_of <rank>: the rank's pid from trainkit-run's "started" line (waits for it).
pid_of() {
  local p=""
  for _ in $(seq 300); do
    p=$(sed -n "s/^trainkit-run: rank $1 (host [^,]*, pid \([0-9]*\)) started/\1/p" "$log")
    [[ -n "$p" ]] && { echo "$p"; return; }
    sleep 0.1
  done
  fail "rank $1 never started"
}
wait_snapshot() {
  for _ in $(seq 600); do
    ls "$1" 2>/dev/null | grep -q '\.tks$' && return
    sleep 0.05
  done
  fail "no periodic snapshot in $1"
}
# finish <case> <want status> <limit s after t_fault>: waits for the job, checks status, time, leftovers.
finish() {
  local c="$1" want="$2" limit="$3" rc
  wait "$job"
  rc=$?
  local t_end
  t_end=$(now)
  cat "$log"
  [[ "$rc" == "$want" ]] || fail "$c: trainkit-run exited $rc, want $want"
  local took
  took=$(secs "$t_fault" "$t_end")
  python3 -c "import sys; sys.exit(0 if $took <= $limit else 1)" || fail "$c: the job took ${took} s to end after the fault (limit $limit s)"
  sleep 0.5
  if pgrep -f "$work/$c/snaps" >/dev/null; then
    pgrep -af "$work/$c/snaps"
    fail "$c: processes of the job are left"
  fi
  no_leftovers "$c"
  echo "--- $c: status $rc, ended ${took} s after the fault"
}
# names_only_rank1 <case> <pid>: every survivor names rank 1 with that pid, and no survivor names another rank.
names_only_rank1() {
  local c="$1" pid="$2"
  for r in 0 2; do
    grep -q "fashion_mnist_ddp: rank $r: .*rank 1 (host [^,]*, pid $pid) did not answer" "$log" ||
      fail "$c: rank $r did not name rank 1 (pid $pid)"
  done
  if grep "did not answer" "$log" | grep -v "rank 1 (host [^,]*, pid $pid) did not answer" | grep -q .; then
    fail "$c: a survivor named another rank"
  fi
}
survivor_step() {
  sed -n -e 's/.*rank 0 wrote the snapshot of step \([0-9]*\) after a peer failed.*/\1/p' \
    -e 's/.*rank 0: the snapshot of step \([0-9]*\) (the last completed) was already written after a peer failed.*/\1/p' "$log"
}
limit_peer=$(python3 -c "print($timeout_ms / 1000 + 5)")

# fault_rank1 <case> <signal> [flags]: after the first periodic snapshot, <signal> to rank 1; the job
# must end with 75 within the timeout + 5 s, named by both survivors; sets pid1.
fault_rank1() {
  local c="$1" sig="$2"
  shift 2
  start "$c" "$@"
  pid1=$(pid_of 1)
  wait_snapshot "$work/$c/snaps"
  kill "-$sig" "$pid1"
  t_fault=$(now)
  finish "$c" 75 "$limit_peer"
  names_only_rank1 "$c" "$pid1"
  [[ -n "$(survivor_step)" ]] || fail "$c: rank 0 wrote no snapshot of the last completed step"
}

# ---- kill ----------------------------------------------------------------------------------------
fault_rank1 kill KILL --compression int8
grep -q "trainkit-run: rank 1 (host [^,]*, pid $pid1) was killed by SIGKILL" "$log" || fail "kill: trainkit-run did not name rank 1"
step=$(survivor_step)
"$run" "${launcher_flags[@]}" -n 2 -- "$exe" "${base[@]}" --compression int8 --snapshot-dir "$work/kill/snaps" \
  --resume 1 --stop-after 3 >"$work/kill-resume.log" 2>&1
rc=$?
[[ $rc == 75 ]] || { cat "$work/kill-resume.log"; fail "kill: the resume on 2 ranks (3 steps, then a stop) exited $rc, want 75"; }
grep -q "at step $step" "$work/kill-resume.log" || { cat "$work/kill-resume.log"; fail "kill: the resume did not start at step $step"; }
no_leftovers kill-resume

# ---- stop ----------------------------------------------------------------------------------------
fault_rank1 stop STOP

# ---- error ---------------------------------------------------------------------------------------
echo "in the way" >"$work/not-a-directory"
log="$work/error.log"
mkdir -p "$work/error"
t_fault=$(now)
"$run" "${launcher_flags[@]}" -n 3 -- "$exe" "${base[@]}" --snapshot-dir "$work/not-a-directory/snaps" >"$log" 2>&1 &
job=$!
finish error 1 5
grep -q "fashion_mnist_ddp: rank 0: .*cannot create the snapshot directory" "$log" || fail "error: rank 0's message is missing"
grep -q "trainkit-run: job exit status 1: rank 0 " "$log" || fail "error: trainkit-run did not name rank 0 as the failed one"

# ---- term ----------------------------------------------------------------------------------------
# Straight to the ranks as soon as the job says it is up (MPI started, the training loop not yet).
start term
pids=("$(pid_of 0)" "$(pid_of 1)" "$(pid_of 2)")
for _ in $(seq 600); do grep -q "rank(s) on the CPU" "$log" && break; sleep 0.01; done
kill -TERM "${pids[@]}"
t_fault=$(now)
finish term 75 10
grep -q "resumable_run: stop requested (signal 15) - snapshot of step [0-9]* written" "$log" || fail "term: no snapshot on the early SIGTERM"
# To trainkit-run, mid-run: it passes the signal on.
start term_launcher
wait_snapshot "$work/term_launcher/snaps"
kill -TERM "$job"
t_fault=$(now)
finish term_launcher 75 10
grep -q "resumable_run: stop requested.* - snapshot of step [0-9]* written" "$log" || fail "term_launcher: no snapshot"
# ---- a program that is not there: every rank says so, the job's status is 127 (a shell's) ----------
"$run" "${launcher_flags[@]}" -n 3 -- "$work/no-such-program" >"$work/missing.log" 2>&1
rc=$?
cat "$work/missing.log"
[[ $rc == 127 ]] || fail "missing: trainkit-run exited $rc, want 127"
[[ $(grep -c "cannot start $work/no-such-program: No such file or directory" "$work/missing.log") == 3 ]] ||
  fail "missing: not every rank said it cannot start the program"
no_leftovers missing
echo "PASS: kill, stop, error, term and a missing program under trainkit-run"
