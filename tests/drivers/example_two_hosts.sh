#!/usr/bin/env bash
# example_two_hosts.sh - ctest example_fashion_mnist_ddp_two_hosts: the DDP example on 2 "hosts"
# (network namespaces joined by a veth pair shaped to 10 Gbit/s, benchmarks/allreduce_netns.sh) x 2
# ranks, with hierarchical int8 (fp32 through shared memory inside a host, int8 between them). It
# must see 2 hosts of 2 ranks, put int8 bytes on the wire, and train (test accuracy above 60 % after the epoch).
# Exit 77 (skipped) where network namespaces cannot be made (not root, no iproute2).
#   example_two_hosts.sh <fashion_mnist_ddp> <data dir> <source dir>
set -uo pipefail
exe="$1" data="$2" src="$3"
if [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null || ! command -v tc >/dev/null; then
  echo "SKIPPED: network namespaces need root and iproute2"; exit 77
fi
if ! ip netns add tk_two_hosts_probe 2>/dev/null; then echo "SKIPPED: cannot create a network namespace"; exit 77; fi
ip netns del tk_two_hosts_probe
out=$(RATES=10gbit RANKS_PER_HOST=2 sh "$src/benchmarks/allreduce_netns.sh" "$exe" --data "$data" --epochs 1 --batch 32 \
      --train-limit 2048 --test-limit 500 --compression int8 --hierarchical 1 2>&1)
rc=$?
echo "$out"
[[ $rc == 0 ]] || { echo "FAIL: exit $rc"; exit 1; }
grep -q "hierarchical: 2 host(s) x 2 rank(s)" <<<"$out" || { echo "FAIL: not 2 hosts x 2 ranks"; exit 1; }
line=$(grep '^epoch 1' <<<"$out") || { echo "FAIL: no epoch line"; exit 1; }
acc=$(sed -n 's/.*test accuracy \([0-9.]*\)%.*/\1/p' <<<"$line")
sent=$(sed -n 's/.*sent \([0-9.]*\) MiB.*/\1/p' <<<"$line")
# 16 steps of 128 images: it learns (chance is 10 %); the epoch's mean loss is too noisy to judge by.
awk -v a="$acc" -v s="$sent" 'BEGIN { exit !(a > 60 && s > 0) }' || { echo "FAIL: test accuracy $acc %, sent $sent MiB"; exit 1; }
echo "PASS: 2 hosts x 2 ranks, test accuracy $acc %, $sent MiB/rank between hosts"
