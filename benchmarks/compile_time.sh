#!/usr/bin/env bash
# benchmarks/compile_time.sh - what including trainkit costs the compiler: CPU seconds (user + sys)
# and peak memory of one `c++ -c` of a user program, read from GNU time (/usr/bin/time -v), for
#
#   header-only   the plain header-only build
#   precompiled   the same file with -DTRAINKIT_PRECOMPILED=1 (what linking trainkit::precompiled
#                 gives a C++ file): the float/CPU ops of trainkit/precompiled.hpp are only declared
#   definitions   the one file trainkit::precompiled compiles, once per project
#                 (<trainkit/precompiled_definitions.hpp>)
#
# Programs: the README's training loop (cut out of README.md, so the figure follows the README) and
# the three single-process examples. Each compile runs --runs times (default 3); the table gives
# the median and the range, and precompiled / header-only as a ratio measured in the same run.
#
#   benchmarks/compile_time.sh [--runs N] [--cxx c++] [--quick]     (--quick: the README loop only)
#
# Flags: -std=c++20 -O2 -fopenmp, the include paths trainkit::trainkit gives (OpenBLAS's OpenMP
# build, oneDNN where its header is installed); CXXFLAGS adds to them. Needs GNU time (Debian: time).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=3
cxx="${CXX:-c++}"
quick=0
while (($#)); do
  case "$1" in
    --runs) runs="${2:?--runs needs a number}"; shift 2 ;;
    --cxx) cxx="${2:?--cxx needs a compiler}"; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "compile_time.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "compile_time.sh: --runs: expected an integer >= 1, got '$runs'" >&2; exit 2; }
if [[ ! -x /usr/bin/time ]]; then
  echo "compile_time.sh: needs GNU time at /usr/bin/time (Debian: apt-get install time)" >&2
  exit 2
fi

arch="$(gcc -dumpmachine 2>/dev/null || echo x86_64-linux-gnu)"
flags=(-std=c++20 -O2 -fopenmp -I"$root/include" -I"$root/examples")
[[ -d "/usr/include/$arch/openblas-openmp" ]] && flags+=(-isystem "/usr/include/$arch/openblas-openmp")
[[ -f /usr/include/dnnl.hpp || -f /usr/include/oneapi/dnnl/dnnl.hpp ]] && flags+=(-DTRAINKIT_HAS_ONEDNN=1)
# shellcheck disable=SC2206  # CXXFLAGS is a list of words by convention
[[ -n "${CXXFLAGS:-}" ]] && flags+=(${CXXFLAGS})

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The README's loop: the first ```cpp block after "## A training loop".
awk '/^## A training loop/{f=1} f&&/^```cpp/{p=1; next} p&&/^```/{exit} p' "$root/README.md" > "$work/readme_loop.cpp"
[[ -s "$work/readme_loop.cpp" ]] || { echo "compile_time.sh: no \`\`\`cpp block under '## A training loop' in README.md" >&2; exit 1; }
printf '#include <trainkit/precompiled_definitions.hpp>\n' > "$work/definitions.cpp"

programs=("README loop=$work/readme_loop.cpp")
if ((quick == 0)); then
  programs+=("fashion_mnist_mlp=$root/examples/fashion_mnist_mlp.cpp"
             "fashion_mnist_cnn=$root/examples/fashion_mnist_cnn.cpp"
             "fashion_mnist_resnet=$root/examples/fashion_mnist_resnet.cpp")
fi

# measure <source> [extra flags...]: prints "cpu_seconds peak_MB" of one compile.
measure() {
  local src="$1"; shift
  local log="$work/time.log"
  if ! /usr/bin/time -v -o "$log" "$cxx" "${flags[@]}" "$@" -c "$src" -o "$work/out.o" 2> "$work/cc.err"; then
    echo "compile_time.sh: compiling $src failed:" >&2
    cat "$work/cc.err" >&2
    exit 1
  fi
  awk -F': ' '/User time/{u=$2} /System time/{s=$2} /Maximum resident set size/{m=$2}
              END{printf "%.2f %.0f\n", u + s, m / 1024}' "$log"
}

# stats <values...>: "median (min-max)"
stats() {
  printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END{m = (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2;
                                              printf "%.2f (%.2f-%.2f)", m, v[1], v[NR]}'
}
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END{print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

echo "compiler: $("$cxx" --version | head -1); flags: ${flags[*]}; $runs run(s) each, interleaved"
echo
printf '| program | header-only CPU s | precompiled CPU s | precompiled / header-only | peak MB header-only / precompiled |\n'
printf '|---|---|---|---|---|\n'
for entry in "${programs[@]}"; do
  name="${entry%%=*}"; src="${entry#*=}"
  ho=(); pc=(); ho_mb=(); pc_mb=(); ratios=()
  for ((r = 0; r < runs; ++r)); do  # interleaved, so that a noisy moment hits both
    read -r c m < <(measure "$src"); ho+=("$c"); ho_mb+=("$m")
    read -r c2 m2 < <(measure "$src" -DTRAINKIT_PRECOMPILED=1); pc+=("$c2"); pc_mb+=("$m2")
    ratios+=("$(awk -v a="$c2" -v b="$c" 'BEGIN{printf "%.3f", a / b}')")
  done
  printf '| %s | %s | %s | %s | %s / %s |\n' "$name" "$(stats "${ho[@]}")" "$(stats "${pc[@]}")" \
    "$(stats "${ratios[@]}")" "$(median "${ho_mb[@]}")" "$(median "${pc_mb[@]}")"
done
defs=(); defs_mb=()
for ((r = 0; r < runs; ++r)); do
  read -r c m < <(measure "$work/definitions.cpp"); defs+=("$c"); defs_mb+=("$m")
done
echo
echo "trainkit::precompiled's one file (compiled once per project): $(stats "${defs[@]}") CPU s, $(median "${defs_mb[@]}") MB"
