#!/usr/bin/env bash
# benchmarks/shared_cores.sh - training on cores another process is using.
#
# 1. The MLP example's epoch (5,000 samples) alone and next to a busy copy of itself (the same
#    program, same size, running in a loop), with trainkit's thread defaults
#    (TRAINKIT_THREAD_DEFAULTS(): passive wait, cores / local ranks threads) and with the OpenMP
#    runtime's own (TRAINKIT_THREAD_DEFAULTS=0, what every program got before). Prints samples/s
#    and "next to a busy process / alone" as a slowdown factor, each the median of --rounds rounds
#    measured back to back.
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
unset OMP_NUM_THREADS OMP_WAIT_POLICY TRAINKIT_THREAD_DEFAULTS TRAINKIT_THREAD_DEFAULTS_SET GOMP_SPINCOUNT

args=(--data "$data" --epochs 2 --train-limit 5000 --test-limit 500)
# samples/s of a run: the last epoch's (the first one warms the caches and the allocator).
rate() { "$@" | awk '/^epoch /{for (i = 1; i < NF; ++i) if ($(i+1) == "samples/s") r = $i} END{print r + 0}'; }
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END{print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
range() { printf '%s\n' "$@" | sort -g | awk 'NR==1{lo=$1} {hi=$1} END{printf "%s-%s", lo, hi}'; }

busy_pid=""
start_busy() {  # a copy of the same program, training in a loop
  ( while :; do "$@" --epochs 1000 > /dev/null 2>&1 || true; done ) &
  busy_pid=$!
  sleep 2
}
stop_busy() { [[ -n "$busy_pid" ]] && { pkill -P "$busy_pid" 2>/dev/null || true; kill "$busy_pid" 2>/dev/null || true; wait "$busy_pid" 2>/dev/null || true; }; busy_pid=""; }
trap stop_busy EXIT

echo "cores: $(nproc); MLP example, 5,000-sample epochs; median (range) of $rounds rounds"
printf '\n| threads | alone samples/s | next to a busy copy samples/s | slowdown |\n|---|---|---|---|\n'
for mode in trainkit runtime; do
  env_mode=()
  [[ $mode == runtime ]] && env_mode=(env TRAINKIT_THREAD_DEFAULTS=0)
  alone=(); shared=(); slow=()
  for ((r = 0; r < rounds; ++r)); do
    a="$(rate "${env_mode[@]}" "$mlp" "${args[@]}")"
    start_busy "${env_mode[@]}" "$mlp" --data "$data" --train-limit 5000 --test-limit 500
    s="$(rate "${env_mode[@]}" "$mlp" "${args[@]}")"
    stop_busy
    alone+=("$a"); shared+=("$s"); slow+=("$(awk -v a="$a" -v s="$s" 'BEGIN{printf "%.2f", a / s}')")
  done
  label="trainkit's defaults (passive, cores / local ranks)"
  [[ $mode == runtime ]] && label="the OpenMP runtime's (TRAINKIT_THREAD_DEFAULTS=0)"
  printf '| %s | %s (%s) | %s (%s) | %sx (%s) |\n' "$label" "$(median "${alone[@]}")" "$(range "${alone[@]}")" \
    "$(median "${shared[@]}")" "$(range "${shared[@]}")" "$(median "${slow[@]}")" "$(range "${slow[@]}")"
done

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
