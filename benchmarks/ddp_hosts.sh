#!/bin/sh
# ddp_hosts.sh - the DDP example end to end on 2 "hosts" x 2 ranks joined by a 1 Gbit/s link
# (benchmarks/allreduce_netns.sh), with fp32 gradients, flat int8 and hierarchical int8 (fp32 inside
# a host, int8 between hosts); then the same three on 1 host x 2 ranks (plain mpirun, shared
# memory). Prints each run's epoch lines (samples/s, communication share, accuracy) and a summary.
#
#   sudo benchmarks/ddp_hosts.sh build/examples/fashion_mnist_ddp [example flags...]
#   default flags: --epochs 2 --batch 16 --train-limit 12000 --test-limit 0 (the whole test set)
# Batch 16 per rank keeps the step communication-bound on this 2-core machine, as a larger model on
# real hosts would be; every run uses the same seed.
set -eu
EXE=${1:-build/examples/fashion_mnist_ddp}
[ $# -gt 0 ] && shift
[ $# -gt 0 ] || set -- --epochs 2 --batch 16 --train-limit 12000 --test-limit 0
EXE=$(cd "$(dirname "$EXE")" && pwd)/$(basename "$EXE")
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(mktemp -d /tmp/tk_ddp_hosts.XXXXXX)
trap 'rm -rf "$OUT"' EXIT

run() {  # run <label> <layout: 2x2|1x2> <compression> <hierarchical> [flags]
  label=$1 layout=$2 c=$3 h=$4
  shift 4
  if [ "$layout" = 2x2 ]; then
    RATES=1gbit RANKS_PER_HOST=2 sh "$HERE/allreduce_netns.sh" "$EXE" --compression "$c" --hierarchical "$h" "$@" \
      >"$OUT/$label" 2>&1
  else
    mpirun --allow-run-as-root --oversubscribe -np 2 "$EXE" --compression "$c" --hierarchical "$h" "$@" >"$OUT/$label" 2>&1
  fi
  echo "--- $label"
  grep '^epoch' "$OUT/$label"
}
for layout in 2x2 1x2; do
  run "$layout-fp32" "$layout" none 0 "$@"
  run "$layout-int8" "$layout" int8 0 "$@"
  run "$layout-hier-int8" "$layout" int8 1 "$@"
done

echo
echo "last epoch: samples/s, comm share, exposed share, test accuracy; speed-up over fp32 of the same layout"
for layout in 2x2 1x2; do
  base=$(grep '^epoch' "$OUT/$layout-fp32" | tail -1 | awk '{print $8}')
  for v in fp32 int8 hier-int8; do
    grep '^epoch' "$OUT/$layout-$v" | tail -1 | awk -v l="$layout" -v v="$v" -v b="$base" \
      '{ gsub(/\)/, "", $13); printf "%-4s %-10s %7s samples/s  comm %-6s exposed %-6s accuracy %-7s %.2fx\n", l, v, $8, $11, $13, $7, $8 / b }'
  done
done
