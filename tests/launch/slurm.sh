#!/usr/bin/env bash
# slurm.sh - ctest launch_slurm: the DDP example under Slurm, on a real one-node Slurm cluster
# (Debian's slurm-wlm and munge) that this script starts on localhost from a generated
# configuration in a temporary directory. Two parts share the cluster:
#
# Part 1, requeue: the 2-rank example as a preemptible job.
# The job (examples/slurm/fashion_mnist_ddp.sbatch, the script users submit) is interrupted twice:
#   1. `scontrol requeue` (what preemption does): Slurm sends SIGTERM to the ranks, they write a
#      snapshot and exit 75, Slurm requeues the job;
#   2. SIGTERM to the batch script alone (`scancel --batch --signal=TERM`, the signal
#      `#SBATCH --signal=B:TERM@<s>` sends before the time limit): the script passes it on to the
#      ranks, they write a snapshot and exit 75, the script requeues the job itself;
# and must then finish with the same parameters digest as an uninterrupted mpirun of the same seed.
# Checked: 3 runs (Restarts=2), each stop wrote a snapshot on SIGTERM, runs 2 and 3 resumed from
# exactly those snapshots (--resume auto), the script requeued the job after the second stop, the
# job COMPLETED with exit code 0, and the digest is bit-identical to the reference.
#
# Part 2, faults: tests/launch/trainkit_run_faults.sh inside a 3-task allocation (salloc -n 3), the
# ranks started by trainkit-run on mpirun inside the allocation, as the sbatch script starts them:
# SIGKILL and SIGSTOP of rank 1, rank 0's own error, SIGTERM to the ranks and to trainkit-run, a
# missing program - the survivors' messages (world rank, host, pid), the snapshot of the last
# completed step, the job's status (75 / 1 / 127), its time to end, nothing left behind.
#
# Exit 77 (skipped) with a "SKIPPED: <reason>" line only where the cluster cannot start (no Slurm
# or munge binaries, not root, a daemon that does not come up). Every daemon started here is
# stopped on any exit, and the temporary directory is removed.
#   slurm.sh <fashion_mnist_ddp> <fashion-mnist dir> <scratch dir>
set -uo pipefail
exe=$1 data=$2 work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
sbatch_script="$here/../../examples/slurm/fashion_mnist_ddp.sbatch"
trainkit_run="$here/../../tools/trainkit-run"
t_start=$(date +%s)
elapsed() { echo "$(($(date +%s) - t_start)) s"; }
skip() { echo "SKIPPED: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

for tool in munged slurmctld slurmd sbatch scontrol sinfo squeue scancel srun; do
  command -v "$tool" >/dev/null || skip "$tool is not installed (Debian: apt-get install slurm-wlm munge)"
done
command -v mpirun >/dev/null || skip "mpirun is not installed (Debian: apt-get install openmpi-bin)"
((EUID == 0)) || skip "the one-node Slurm cluster runs its daemons as root (SlurmUser=root); not root here"
[[ -x "$exe" ]] || fail "no executable $exe"
# The job runs in the scratch directory: absolute paths.
exe=$(realpath "$exe") data=$(realpath -m "$data") work=$(realpath -m "$work")
[[ -r "$sbatch_script" ]] || fail "no $sbatch_script"

{ rm -rf "$work" && mkdir -p "$work"; } || fail "cannot create $work"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/trainkit-slurm.XXXXXX") || fail "mktemp failed"
chmod 700 "$tmp"
# Nothing of an enclosing Slurm job (ctest run inside an allocation) may leak into the commands here.
while read -r v; do unset "$v"; done < <(env | sed -n 's/^\(SLURM_[A-Za-z0-9_]*\)=.*/\1/p')
export SLURM_CONF="$tmp/slurm.conf"

pids=()
cleanup() {
  local rc=$?
  if [[ -f "$SLURM_CONF" ]] && ((${#pids[@]})); then
    # End the cluster's jobs first (their slurmstepd would outlive slurmd), then the daemons.
    local jobs
    mapfile -t jobs < <(squeue -h -o %i 2>/dev/null)
    ((${#jobs[@]})) && scancel "${jobs[@]}" 2>/dev/null
    for _ in $(seq 50); do [[ -z "$(squeue -h -o %i 2>/dev/null)" ]] && break; sleep 0.2; done
  fi
  if ((rc != 0 && rc != 77)); then  # the daemons' side of a failure
    for f in "$tmp"/log/*.log; do [[ -s "$f" ]] && { echo "--- tail of $f"; tail -15 "$f"; }; done
    cp -r "$tmp/log" "$work/daemon-logs" 2>/dev/null
  fi
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do kill "${pids[i]}" 2>/dev/null; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  wait 2>/dev/null
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck source=tests/drivers/free_port.sh
source "$here/../drivers/free_port.sh"

# --- munge: a fresh key, its own socket.
mkdir -p "$tmp/munge" "$tmp/log" "$tmp/state" "$tmp/spool"
chmod 700 "$tmp/munge"
head -c 1024 /dev/urandom > "$tmp/munge/munge.key" && chmod 400 "$tmp/munge/munge.key"
munged -F --force --key-file="$tmp/munge/munge.key" --socket="$tmp/munge/socket" \
  --pid-file="$tmp/munge/munged.pid" --seed-file="$tmp/munge/seed" --log-file="$tmp/log/munged.log" \
  > "$tmp/log/munged.out" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -S "$tmp/munge/socket" ]] && break; kill -0 "${pids[0]}" 2>/dev/null || break; sleep 0.1; done
[[ -S "$tmp/munge/socket" ]] || skip "munged did not start: $(tail -3 "$tmp/log/munged.out" "$tmp/log/munged.log" 2>/dev/null | tr '\n' ' ')"

# --- slurm.conf: one node (this machine, as localhost) and one partition. No accounting, no
# cgroups. cred_expire=5 and a scheduler pass every 2 s: a requeued job waits ~12 s, not ~2 min.
cpus=$(nproc)
((cpus < 3)) && cpus=3  # three tasks (part 2); config_overrides lets the node claim them on fewer cores
ctld_port=$(free_port) || skip "no free TCP port for slurmctld"
slurmd_port=$(free_port) || skip "no free TCP port for slurmd"
cat > "$SLURM_CONF" <<CONF
ClusterName=trainkit-test
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$tmp/munge/socket,cred_expire=5
StateSaveLocation=$tmp/state
SlurmdSpoolDir=$tmp/spool
SlurmctldPidFile=$tmp/slurmctld.pid
SlurmdPidFile=$tmp/slurmd.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
slurmctld -D -i > "$tmp/log/slurmctld.out" 2>&1 &
pids+=($!)
slurmd -D -N localhost > "$tmp/log/slurmd.out" 2>&1 &
pids+=($!)
state=""
for _ in $(seq 150); do
  state=$(sinfo -h -n localhost -o %T 2>/dev/null)
  [[ "$state" == idle ]] && break
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || break 2; done
  sleep 0.2
done
if [[ "$state" != idle ]]; then
  skip "the one-node Slurm cluster did not come up (node state '${state:-none}'):" \
    "$(tail -3 "$tmp/log/slurmctld.out" "$tmp/log/slurmctld.log" "$tmp/log/slurmd.out" "$tmp/log/slurmd.log" 2>/dev/null | tr '\n' ' ')"
fi
echo "cluster: slurmctld :$ctld_port, slurmd :$slurmd_port, node localhost idle with $cpus CPUs ($(elapsed))"

# The sbatch script's default: trainkit-run on Open MPI's mpirun, which reads the allocation.
launch=mpirun

# 128 steps (8192 images / 2 ranks / 64), ~5 s on 2 cores: long enough to interrupt twice.
args=(--epochs 2 --train-limit 8192 --test-limit 500 --batch 64 --seed 7 --snapshot-every 10)
digest_of() { sed -n 's/.*parameters digest \([0-9a-f]*\).*/\1/p' "$1"; }

# --- the uninterrupted reference, straight from mpirun (same seed, one thread per rank).
OMP_NUM_THREADS=1 mpirun --allow-run-as-root --oversubscribe -np 2 "$exe" --data "$data" "${args[@]}" \
  > "$work/reference.log" 2>&1 || { tail -20 "$work/reference.log"; fail "the reference run failed"; }
reference=$(digest_of "$work/reference.log")
[[ -n "$reference" ]] || { cat "$work/reference.log"; fail "no digest from the reference run"; }
echo "reference (mpirun, uninterrupted): digest $reference ($(elapsed))"

# --- the job, through the sbatch script users submit.
snaps="$work/snapshots"
out="$work/job.out"
# Open MPI's shared memory and session directories go to directories of this test, checked at the end.
job_shm="/dev/shm/trainkit-slurm-test-$$"
mkdir -p "$job_shm" "$work/ompi-tmp"
jid=$(cd "$work" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  OMPI_MCA_btl_vader_backing_directory="$job_shm" OMPI_MCA_orte_tmpdir_base="$work/ompi-tmp" \
  TRAINKIT_DDP_EXE="$exe" TRAINKIT_DATA="$data" TRAINKIT_SNAPSHOT_DIR="$snaps" TRAINKIT_LAUNCH="$launch" \
  TRAINKIT_RUN="$trainkit_run" \
  sbatch --parsable --output="$out" "$sbatch_script" "${args[@]}") || fail "sbatch failed: $jid"
jid=${jid%%;*}
echo "submitted job $jid ($launch)"

job_field() { scontrol show job "$jid" 2>/dev/null | grep -o "\b$1=[^ ]*" | head -1 | cut -d= -f2; }
newest_snapshot_step() {  # the step of the newest snapshot file, or -1
  local f
  f=$(find "$snaps" -maxdepth 1 -name 'snapshot-*.tks' -printf '%f\n' 2>/dev/null |
      sed -n 's/^snapshot-0*\([0-9][0-9]*\)\.tks$/\1/p' | sort -n | tail -1)
  echo "${f:--1}"
}
show_job() { echo "--- $out"; cat "$out" 2>/dev/null; echo "--- scontrol show job $jid"; scontrol show job "$jid"; }
# wait_for <seconds> <what> <command...>: poll until the command succeeds; fail if the job ended.
wait_for() {
  local limit=$1 what=$2 i
  shift 2
  for ((i = 0; i < limit * 10; i++)); do
    "$@" && return 0
    case "$(job_field JobState)" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY)
      "$@" && return 0  # it may have ended between the check and the state query (waiting for the end)
      show_job; fail "job $jid ended ($(job_field JobState)) while waiting for $what";;
    esac
    sleep 0.1
  done
  show_job
  fail "timed out after $limit s waiting for $what"
}
running_past() {  # running_past <step>: the job runs and has a snapshot of a later step
  [[ "$(job_field JobState)" == RUNNING ]] && (($(newest_snapshot_step) >= $1))
}
resumed_at_least() {  # resumed_at_least <n>: the output has n "resumed from" lines
  local n
  n=$(grep -c "resumable_run: resumed from" "$out" 2>/dev/null)
  ((${n:-0} >= $1))
}
completed() { [[ "$(job_field JobState)" == COMPLETED ]]; }

# 1. Preempted: scontrol requeue once the job is 20 steps in.
wait_for 60 "run 1 to pass step 20" running_past 20
echo "run 1: snapshot of step $(newest_snapshot_step) on disk, scontrol requeue ($(elapsed))"
scontrol requeue "$jid" || { show_job; fail "scontrol requeue $jid failed"; }

# 2. The time-limit warning: SIGTERM to the batch script once run 2 is 20 steps past its resume.
wait_for 90 "run 2 to resume" resumed_at_least 1
r1=$(sed -n "s/.*resumable_run: resumed from .* at step \([0-9]*\).*/\1/p" "$out" | head -1)
echo "run 2: resumed at step $r1 ($(elapsed))"
wait_for 60 "run 2 to pass step $((r1 + 20))" running_past $((r1 + 20))
echo "run 2: snapshot of step $(newest_snapshot_step) on disk, SIGTERM to the batch script ($(elapsed))"
scancel --batch --signal=TERM "$jid" || { show_job; fail "scancel --batch --signal=TERM $jid failed"; }

# 3. Run 3 to the end.
wait_for 90 "run 3 to resume" resumed_at_least 2
echo "run 3: resumed ($(elapsed))"
wait_for 120 "the job to complete" completed

# --- the checks.
restarts=$(job_field Restarts) exit_code=$(job_field ExitCode)
mapfile -t stops < <(sed -n 's/.*resumable_run: stop requested (signal 15) - snapshot of step \([0-9]*\) written.*/\1/p' "$out")
mapfile -t resumes < <(sed -n 's/.*resumable_run: resumed from .* at step \([0-9]*\).*/\1/p' "$out")
mapfile -t digests < <(digest_of "$out")
bad=()
[[ "$restarts" == 2 ]] || bad+=("Restarts=$restarts, expected 2 (one scontrol requeue, one requeue by the script)")
[[ "$exit_code" == 0:0 ]] || bad+=("ExitCode=$exit_code, expected 0:0")
for run in 1 2 3; do
  grep -q "fashion_mnist_ddp.sbatch: job $jid run $run " "$out" || bad+=("no 'run $run' line from the sbatch script")
done
(($(grep -c "starting from scratch" "$out") == 1)) || bad+=("the job did not start from scratch exactly once")
((${#stops[@]} == 2)) || bad+=("${#stops[@]} snapshot(s) written on SIGTERM (${stops[*]}), expected 2")
((${#resumes[@]} == 2)) || bad+=("${#resumes[@]} resume(s) (${resumes[*]}), expected 2")
[[ "${stops[*]}" == "${resumes[*]}" ]] || bad+=("resumed at step(s) ${resumes[*]}, but the stops wrote ${stops[*]}")
((${#resumes[@]} == 2 && resumes[0] > 0 && resumes[1] > resumes[0] && resumes[1] < 128)) ||
  bad+=("resume steps ${resumes[*]} are not 0 < first < second < 128")
grep -q "fashion_mnist_ddp.sbatch: requeueing job $jid" "$out" || bad+=("the script did not requeue the job after the batch SIGTERM")
((${#digests[@]} == 1)) || bad+=("${#digests[@]} digest line(s), expected 1")
[[ "${digests[0]:-}" == "$reference" ]] || bad+=("digest ${digests[0]:-none} after two requeues != $reference uninterrupted")
left=$(find "$job_shm" "$work/ompi-tmp" -mindepth 1 \( -type f -o -name 'pid.*' -o -name 'jf.*' \) 2>/dev/null | head -5)
rm -rf "$job_shm"
[[ -z "$left" ]] || bad+=("the job left shared memory or Open MPI session directories: $(echo $left)")
if ((${#bad[@]})); then
  show_job
  printf 'FAIL: %s\n' "${bad[@]}"
  exit 1
fi
echo "job $jid: 3 runs (Restarts=$restarts), stopped at steps ${stops[*]} by scontrol requeue and the batch SIGTERM," \
  "resumed at ${resumes[*]}, digest ${digests[0]} = reference ($(elapsed))"

# --- part 2: the fault matrix in a 3-task allocation, ranks started by trainkit-run on mpirun
# (which starts its daemon through srun). Not on srun itself: its PMIx plugin cancels the whole
# step when one rank dies, before a survivor can name it (docs/ddp.md, "Preemptible jobs on Slurm").
launcher=(--launcher mpirun)

OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 salloc --quiet -n 3 --cpus-per-task=1 \
  bash "$here/trainkit_run_faults.sh" "$trainkit_run" "$exe" "$data" "$work/faults" "${launcher[@]}" \
  >"$work/faults.log" 2>&1
rc=$?
cat "$work/faults.log"
((rc == 0)) || fail "the fault matrix under Slurm (salloc -n 3, trainkit-run ${launcher[*]}) failed (status $rc)"
grep -q "^PASS: " "$work/faults.log" || fail "the fault matrix under Slurm did not report PASS"
echo "faults under Slurm (${launcher[*]}): passed ($(elapsed))"
echo "OK"
