#!/usr/bin/env bash
# scripts/fuzz.sh - build the libFuzzer harnesses of tests/fuzz/ and run each for a while.
#
#   scripts/fuzz.sh              every harness for 30 seconds
#   scripts/fuzz.sh 300          every harness for 300 seconds
#   scripts/fuzz.sh 60 idx       only fuzz_idx (names: idx cifar10 snapshot)
#
# Builds build-fuzz/fuzz_<name> with clang++ -fsanitize=fuzzer,address,undefined (no OpenMP: the
# headers detect its absence, and the fuzz inputs are far below the sizes that go parallel), seeds
# build-fuzz/corpus/<name>/ from tests/fuzz/corpus/<name>/ (the corpus grows across runs), and runs
# the harness with -max_total_time=SECONDS -rss_limit_mb=2048 -timeout=10. Crash, leak, timeout
# and out-of-memory inputs are written to build-fuzz/artifacts/<name>/ and printed with the
# command that reproduces them. The harnesses run side by side, FUZZ_JOBS at a time (default: the
# number of cores), each on a core of its own for SECONDS.
# Exit status: 0 when no harness found anything, 1 when one did (or a build failed), 2 for bad
# arguments, 77 when clang++ is not installed.
set -uo pipefail

usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

all_harnesses=(idx cifar10 snapshot)
seconds=30
harnesses=()
for arg in "$@"; do
  case "$arg" in
    -h | --help) usage; exit 0 ;;
    *)
      if [[ "$arg" =~ ^[0-9]+$ ]] && ((${#harnesses[@]} == 0)) && [[ -z "${seconds_set:-}" ]]; then
        seconds="$arg"
        seconds_set=1
      elif [[ " ${all_harnesses[*]} " == *" $arg "* ]]; then
        harnesses+=("$arg")
      else
        echo "fuzz.sh: unknown argument '$arg'" >&2
        usage >&2
        exit 2
      fi
      ;;
  esac
done
((seconds >= 1)) || { echo "fuzz.sh: SECONDS must be at least 1" >&2; exit 2; }
((${#harnesses[@]})) || harnesses=("${all_harnesses[@]}")

CXX="${FUZZ_CXX:-clang++}"
if ! command -v "$CXX" >/dev/null 2>&1; then
  echo "fuzz.sh: clang++ not found (Debian: apt-get install clang)" >&2
  exit 77
fi

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$repo_root/build-fuzz"
mkdir -p "$build"

# shellcheck disable=SC2054  # the commas are part of -fsanitize=..., not array separators
cxxflags=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
  -I"$repo_root/include")
# Extra flags, e.g. FUZZ_CXXFLAGS=-DTRAINKIT_FUZZ_STRICT_BOOL=1 (see tests/fuzz/README.md).
read -r -a extra_flags <<<"${FUZZ_CXXFLAGS:-}"
cxxflags+=("${extra_flags[@]}")
libs=(-lz)  # zlib: gzip'd IDX files, and the CRC32 of snapshots

# Largest input each harness is given: a few records, files or sections; gzip stays far below the
# RSS limit even at the worst deflate ratio.
declare -A max_len=([idx]=8192 [cifar10]=16384 [snapshot]=8192)

# The harnesses write their inputs to per-process temporary files; keep them in the build tree.
export TMPDIR="$build/tmp"
mkdir -p "$TMPDIR"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"

status=0
declare -A result
# Build every harness first (a few seconds each), then run them side by side, as many at a time as
# there are cores (FUZZ_JOBS): each still gets a whole core for its SECONDS.
runnable=()
for h in "${harnesses[@]}"; do
  src="$repo_root/tests/fuzz/fuzz_$h.cpp"
  bin="$build/fuzz_$h"
  echo "=== fuzz_$h: building"
  start=$SECONDS
  if ! "$CXX" "${cxxflags[@]}" "$src" -o "$bin" "${libs[@]}"; then
    echo "fuzz.sh: building fuzz_$h failed" >&2
    result[$h]="BUILD FAILED"
    status=1
    continue
  fi
  echo "    built in $((SECONDS - start)) s"
  runnable+=("$h")
done

# run_one <name>: one harness for $seconds; its exit status and time go to $build/fuzz_<name>.rc.
run_one() {
  local h="$1" corpus="$build/corpus/$1" artifacts="$build/artifacts/$1" log="$build/fuzz_$1.log"
  mkdir -p "$corpus"
  cp -f "$repo_root/tests/fuzz/corpus/$h/"* "$corpus/"
  rm -rf "$artifacts"
  mkdir -p "$artifacts"
  local start=$SECONDS
  "$build/fuzz_$h" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -max_len="${max_len[$h]}" \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" >"$log" 2>&1
  echo "$? $((SECONDS - start))" >"$build/fuzz_$h.rc"
}
jobs_max="${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}"
for h in "${runnable[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs_max)); do wait -n; done
  echo "=== fuzz_$h: running for $seconds s (log: build-fuzz/fuzz_$h.log)"
  run_one "$h" &
done
wait

for h in "${runnable[@]}"; do
  corpus="$build/corpus/$h"
  artifacts="$build/artifacts/$h"
  log="$build/fuzz_$h.log"
  read -r rc elapsed <"$build/fuzz_$h.rc"
  execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  mapfile -t found < <(find "$artifacts" -maxdepth 1 -type f \
    \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | sort)
  if ((rc != 0 || ${#found[@]} > 0)); then
    status=1
    result[$h]="FINDING (exit $rc, ${execs:-?} runs in $elapsed s)"
    echo "!!! fuzz_$h found a problem (exit status $rc); the end of its log:"
    grep -v '^#[0-9]' "$log" | tail -n 40 | sed 's/^/    /'
    for f in "${found[@]}"; do
      echo "    reproducer: ${f#"$repo_root"/}"
      echo "    reproduce:  build-fuzz/fuzz_$h ${f#"$repo_root"/}"
    done
    ((${#found[@]})) || echo "    (no reproducer was written; see the log)"
  else
    result[$h]="ok (${execs:-?} runs in $elapsed s, corpus $(find "$corpus" -type f | wc -l) files)"
  fi
done
rm -rf "$TMPDIR"

echo "=== summary"
for h in "${harnesses[@]}"; do
  printf '  fuzz_%-9s %s\n' "$h" "${result[$h]}"
done
exit "$status"
