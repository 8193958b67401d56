#!/usr/bin/env bash
# benchmarks/shared_cores.sh - training on cores another process is using.
#
# 1. The MLP example's epoch (5,000 samples) alone and next to a busy copy of itself (the same
#    program, same settings, training in a loop), under each wait policy
#    (trainkit/core/wait_governor.hpp): trainkit's default (TRAINKIT_WAIT=adaptive: spin while the
#    CPUs are free, sleep while they are contended), the runtime's spinning default
#    (TRAINKIT_WAIT=spin) and sleeping always (TRAINKIT_WAIT=sleep, like OMP_WAIT_POLICY=passive).
#    No TRAINKIT_THREAD_DEFAULTS() either (TRAINKIT_THREAD_DEFAULTS=0): what a program without the
#    macro gets. Prints samples/s and "next to a busy copy / alone" as a slowdown factor, each the
#    median of --rounds rounds measured back to back, and one thread on half the cores alone: the
#    fair share two copies can each expect.
# 2. With MPI: the DDP example under `mpirun -np 2` against one process of it (an MPI singleton,
#    all cores' threads) on the same cores: samples/s of the whole job.
#
#   benchmarks/shared_cores.sh <build dir> [--rounds N] [--data DIR]
set -euo pipefail

build="${1:?usage: shared_cores.sh <build dir> [--rounds N] [--data DIR]}"; shift
rounds=3
data=/usr/share/datasets/fashion-mnist
while (($#)); do
  case "$1" in
    --rounds) rounds="${2:?}"; shift 2 ;;
    --data) data="${2:?}"; shift 2 ;;
    *) echo "shared_cores.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mlp="$build/examples/fashion_mnist_mlp"
ddp="$build/examples/fashion_mnist_ddp"
[[ -x "$mlp" ]] || { echo "shared_cores.sh: no $mlp (build the examples)" >&2; exit 2; }
# Whatever the caller's shell exports would decide the comparison: start from nothing.
unset OMP_NUM_THREADS OMP_WAIT_POLICY TRAINKIT_THREAD_DEFAULTS TRAINKIT_THREAD_DEFAULTS_SET GOMP_SPINCOUNT TRAINKIT_WAIT
export TRAINKIT_THREAD_DEFAULTS=0

args=(--data "$data" --epochs 2 --train-limit 5000 --test-limit 500)
# samples/s of a run: the last epoch's (the first one warms the caches and the allocator).
rate() { "$@" | awk '/^epoch /{for (i = 1; i < NF; ++i) if ($(i+1) == "samples/s") r = $i} END{print r + 0}'; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END{print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
range() { printf '%s\n' "$@" | sort -g | awk 'NR==1{lo=$1} {hi=$1} END{printf "%s-%s", lo, hi}'; }

busy_pid=""
start_busy() {  # a copy of the same program, training for far longer than the measurement
  "$@" --epochs 100000 > /dev/null 2>&1 &
  busy_pid=$!
  sleep 2
}
stop_busy() { [[ -n "$busy_pid" ]] && { kill "$busy_pid" 2>/dev/null || true; wait "$busy_pid" 2>/dev/null || true; }; busy_pid=""; }
trap stop_busy EXIT

echo "CPU: $(awk -F': ' '/^model name/{print $2; exit}' /proc/cpuinfo); flags: $(grep -m1 -o -w -E 'avx2|fma|f16c|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "cores: $(nproc); MLP example, 5,000-sample epochs; median (range) of $rounds rounds"
printf '\n| wait | alone samples/s | next to a busy copy samples/s | slowdown |\n|---|---|---|---|\n'
for mode in adaptive spin sleep; do
  alone=(); shared=(); slow=()
  for ((r = 0; r < rounds; ++r)); do
    a="$(rate env TRAINKIT_WAIT=$mode "$mlp" "${args[@]}")"
    start_busy env TRAINKIT_WAIT=$mode "$mlp" --data "$data" --train-limit 5000 --test-limit 500
    s="$(rate env TRAINKIT_WAIT=$mode "$mlp" "${args[@]}")"
    stop_busy
    alone+=("$a"); shared+=("$s"); slow+=("$(awk -v a="$a" -v s="$s" 'BEGIN{printf "%.2f", a / s}')")
  done
  case $mode in
    adaptive) label="TRAINKIT_WAIT=adaptive (the default)" ;;
    spin) label="TRAINKIT_WAIT=spin (the runtime's own)" ;;
    sleep) label="TRAINKIT_WAIT=sleep (passive)" ;;
  esac
  printf '| %s | %s (%s) | %s (%s) | %sx (%s) |\n' "$label" "$(median "${alone[@]}")" "$(range "${alone[@]}")" \
    "$(median "${shared[@]}")" "$(range "${shared[@]}")" "$(median "${slow[@]}")" "$(range "${slow[@]}")"
done
half=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
fair=()
for ((r = 0; r < rounds; ++r)); do fair+=("$(rate env OMP_NUM_THREADS=$half "$mlp" "${args[@]}")"); done
printf '\nFair share: %s thread(s) alone (half the cores): %s (%s) samples/s\n' "$half" "$(median "${fair[@]}")" "$(range "${fair[@]}")"

if [[ -x "$ddp" ]] && command -v mpirun > /dev/null; then
  mpi=(mpirun --oversubscribe)
  [[ $(id -u) == 0 ]] && mpi+=(--allow-run-as-root)
  dargs=(--data "$data" --epochs 2 --train-limit 5000 --test-limit 500)
  one=(); two=()
  for ((r = 0; r < rounds; ++r)); do
    one+=("$(rate "$ddp" "${dargs[@]}")")  # an MPI singleton: one process, every core's threads
    two+=("$(rate "${mpi[@]}" -np 2 "$ddp" "${dargs[@]}")")
  done
  printf '\nDDP example (CNN), samples/s of the whole job: one process: %s (%s); mpirun -np 2: %s (%s); np 2 / one process: %s\n' \
    "$(median "${one[@]}")" "$(range "${one[@]}")" "$(median "${two[@]}")" "$(range "${two[@]}")" \
    "$(awk -v a="$(median "${two[@]}")" -v b="$(median "${one[@]}")" 'BEGIN{printf "%.2f", a / b}')"
fi
