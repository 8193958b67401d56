#!/usr/bin/env bash
# trainkit_run_hosts.sh - ctest launch_trainkit_run_hosts: tools/trainkit-run on "hosts" made of
# network namespaces (benchmarks/allreduce_netns.sh, links shaped to 1 Gbit/s; mpirun starts the
# remote daemons through an rsh stand-in), faults sent from outside:
#   flat3    3 hosts x 1 rank, int8: SIGKILL of rank 1 (on host h1)
#   hier2x2  2 hosts x 2 ranks, hierarchical int8: SIGKILL of world rank 2 (the first of host b)
#   stop2x2  2 hosts x 2 ranks, hierarchical int8: SIGSTOP of world rank 3
#   stop3    3 hosts x 1 rank, int8: SIGSTOP of rank 2
#   full3    3 hosts x 1 rank (and full2x2: 2 x 2, hierarchical): rank 0's own error - its snapshot disk (a 1 MiB tmpfs) is full at the
#            first periodic snapshot: its message (file, offset, errno), the job's status 1 within
#            5 s, the other ranks ended by trainkit-run, the snapshot directory left without a
#            partial file
# Each: every survivor names the failed rank by its world rank, host and pid within the timeout +
# 5 s and never a live rank; rank 0 says which snapshot holds the last completed step; the job's
# status is 75; no mpirun, orted or rank is left, nor a namespace. Exit 77 (skipped) where
# network namespaces cannot be made (not root, no iproute2).
#   trainkit_run_hosts.sh <trainkit-run> <fashion_mnist_ddp> <data dir> <source dir> <work dir>
set -uo pipefail
run="$1" exe="$2" data="$3" src="$4" work="$5"
if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "SKIPPED: network namespaces need root and iproute2"; exit 77
fi
if ! ip netns add tk_run_hosts_probe 2>/dev/null; then echo "SKIPPED: cannot create a network namespace"; exit 77; fi
ip netns del tk_run_hosts_probe
# shellcheck source=tests/launch/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"  # timeout_ms, fail, now; a fresh $work

# nothing_left <case> <pattern of the job's command lines>: no mpirun daemon, rank, namespace, shared
# memory or session directory of the job is left.
nothing_left() {
  sleep 0.5
  if pgrep -x orted >/dev/null || pgrep -f "$2" >/dev/null; then
    pgrep -a orted; pgrep -af "$2"; fail "$1: processes of the job are left"
  fi
  ip netns list | grep -q tk_allreduce && fail "$1: a namespace is left"
  no_leftovers "$1"
}

# one_case <name> <hosts> <ranks per host> <victim world rank> <signal> [example flags]
one_case() {
  local name="$1" hosts="$2" per="$3" victim="$4" sig="$5"
  shift 5
  local log="$work/$name.log" snaps="$work/$name/snaps"
  mkdir -p "$work/$name"
  TRAINKIT_RUN="$run" RATES=1gbit HOSTS=$hosts RANKS_PER_HOST=$per sh "$src/benchmarks/allreduce_netns.sh" "$exe" \
    --data "$data" --epochs 2 --train-limit 6000 --test-limit 256 --batch 16 --seed 5 --snapshot-every 5 \
    --compression int8 --snapshot-dir "$snaps" "$@" >"$log" 2>&1 &
  local job=$! pid="" t_fault t_named rc
  for _ in $(seq 600); do
    pid=$(sed -n "s/^trainkit-run: rank $victim (host [^,]*, pid \([0-9]*\)) started/\1/p" "$log")
    [[ -n "$pid" ]] && ls "$snaps" 2>/dev/null | grep -q '\.tks$' && break
    sleep 0.05
  done
  [[ -n "$pid" ]] || { cat "$log"; fail "$name: rank $victim never started or no periodic snapshot"; }
  local host
  host=$(sed -n "s/^trainkit-run: rank $victim (host \([^,]*\), pid $pid) started/\1/p" "$log")
  kill "-$sig" "$pid"
  t_fault=$(now)
  # The survivors' messages, timed as they appear.
  local survivors=$((hosts * per - 1)) named=0
  for _ in $(seq 400); do
    named=$(grep -c "did not answer" "$log")
    ((named >= survivors)) && break
    sleep 0.05
  done
  t_named=$(now)
  wait "$job"
  rc=$?
  cat "$log"
  [[ $rc == 75 ]] || fail "$name: the job exited $rc, want 75"
  python3 -c "import sys; sys.exit(0 if $t_named - $t_fault <= $timeout_ms / 1000 + 5 else 1)" ||
    fail "$name: the survivors named the failed rank only $(python3 -c "print(f'{$t_named - $t_fault:.1f}')") s after the fault"
  for ((r = 0; r < hosts * per; ++r)); do
    ((r == victim)) && continue
    grep -q "fashion_mnist_ddp: rank $r: .*rank $victim (host $host, pid $pid) did not answer" "$log" ||
      fail "$name: rank $r did not name rank $victim (host $host, pid $pid)"
  done
  if grep "did not answer" "$log" | grep -v "rank $victim (host $host, pid $pid) did not answer" | grep -q .; then
    fail "$name: a survivor named a live rank"
  fi
  grep -Eq "resumable_run: rank 0( wrote the snapshot of step [0-9]+|: the snapshot of step [0-9]+ \(the last completed\))" "$log" ||
    fail "$name: rank 0 did not write (or name) the snapshot of the last completed step"
  nothing_left "$name" "$snaps"
  echo "--- $name: rank $victim ($host) named by all $survivors survivors within $(python3 -c "print(f'{$t_named - $t_fault:.1f}')") s; status 75; nothing left"
}

# own_error_case <name> <hosts> <ranks per host> [example flags]: rank 0's snapshot disk is full.
own_error_case() {
  local name="$1" hosts="$2" per="$3"
  shift 3
  local log="$work/$name.log" disk="$work/$name/disk"
  mkdir -p "$disk"
  mount -t tmpfs -o size=1m tmpfs "$disk" || fail "$name: cannot mount a 1 MiB tmpfs on $disk"
  local t0 rc t1
  t0=$(now)
  TRAINKIT_RUN="$run" RATES=1gbit HOSTS=$hosts RANKS_PER_HOST=$per sh "$src/benchmarks/allreduce_netns.sh" "$exe" \
    --data "$data" --epochs 2 --train-limit 6000 --test-limit 256 --batch 16 --seed 5 --snapshot-every 5 \
    --compression int8 --snapshot-dir "$disk/snaps" "$@" >"$log" 2>&1
  rc=$?
  t1=$(now)
  local left
  left=$(ls -A "$disk/snaps" 2>/dev/null)
  umount "$disk"
  cat "$log"
  [[ $rc == 1 ]] || fail "$name: the job exited $rc, want 1 (rank 0's own error)"
  grep -q "fashion_mnist_ddp: rank 0: snapshot: writing '.*' failed at byte offset [0-9]* .*No space left on device" "$log" ||
    fail "$name: rank 0 did not say which file, offset and error"
  grep -q "trainkit-run: job exit status 1: rank 0 (host [^,]*, pid [0-9]*) failed with its own error" "$log" ||
    fail "$name: trainkit-run did not name rank 0"
  [[ -z "$left" ]] || fail "$name: the full disk holds '$left' (a partial snapshot)"
  # The ranks start in ~1-2 s on 2 cores and rank 0 fails at step 5, a few seconds in; the job,
  # its other ranks ended by trainkit-run, must be over within 15 s of the start.
  python3 -c "import sys; sys.exit(0 if $t1 - $t0 <= 15 else 1)" ||
    fail "$name: the job took $(python3 -c "print(f'{$t1 - $t0:.1f}')") s"
  nothing_left "$name" "$disk"
  echo "--- $name: rank 0's full disk: status 1 after $(python3 -c "print(f'{$t1 - $t0:.1f}')") s; nothing left"
}

one_case flat3 3 1 1 KILL
one_case hier2x2 2 2 2 KILL --hierarchical 1
one_case stop2x2 2 2 3 STOP --hierarchical 1
one_case stop3 3 1 2 STOP
own_error_case full3 3 1
own_error_case full2x2 2 2 --hierarchical 1
echo "PASS: 3 x 1 flat and 2 x 2 hierarchical, each with SIGKILL, SIGSTOP and a full disk, under trainkit-run"
