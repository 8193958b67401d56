#!/bin/sh
# allreduce_netns.sh - bench_allreduce (or any MPI program) on 2 "hosts" across a slow link: two
# network namespaces on this machine joined by a veth pair, shaped with tc (tbf, both directions)
# to 1 Gbit/s and then to 10 Gbit/s, with RANKS_PER_HOST ranks in each (default 1). Everything it creates (namespaces, veth, hostfile) is removed when it exits, also on
# error or Ctrl-C. Needs root (ip netns, tc) and OpenMPI's mpirun.
#
#   sudo benchmarks/allreduce_netns.sh [BENCH [bench args...]]
#   sudo benchmarks/allreduce_netns.sh build/benchmarks/bench_allreduce --sizes=25
#   RATES="1gbit" sudo benchmarks/allreduce_netns.sh      (rates to run; default "1gbit 10gbit")
#   RANKS_PER_HOST=2 sudo benchmarks/allreduce_netns.sh build/benchmarks/bench_allreduce --sizes=25 --hierarchical
#       2 hosts x 2 ranks: the ranks of a host talk through shared memory (btl vader), the hosts
#       through the shaped veth; --hierarchical compares dist::hierarchical with the flat allreduces
#   RANKS_PER_HOST=2 sudo benchmarks/allreduce_netns.sh build/examples/fashion_mnist_ddp --hierarchical 1 ...
#
# How the ranks land in different namespaces: mpirun itself runs in namespace A and sees a hostfile
# of two "hosts", A's and B's veth addresses. A's address is local, so rank 0 starts as mpirun's
# child in A; for B, mpirun calls its rsh agent - here a three-line script that runs the daemon
# command under `ip netns exec B` instead of ssh. Both the daemons' control traffic and the ranks'
# data (btl tcp, restricted to the veth subnet) then cross the shaped veth; shared memory is used
# only between the ranks of one "host" (RANKS_PER_HOST > 1), as it would be on real machines.
set -eu

BENCH=${1:-build/benchmarks/bench_allreduce}
[ $# -gt 0 ] && shift
RATES=${RATES:-"1gbit 10gbit"}
RANKS_PER_HOST=${RANKS_PER_HOST:-1}
NS_A=tk_allreduce_a
NS_B=tk_allreduce_b
DEV_A=tk_ar_a
DEV_B=tk_ar_b
NET=10.231.77
ADDR_A=$NET.1
ADDR_B=$NET.2

die() { echo "allreduce_netns.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, tc)"
command -v ip >/dev/null || die "needs ip (iproute2)"
command -v tc >/dev/null || die "needs tc (iproute2)"
command -v mpirun >/dev/null || die "needs mpirun (openmpi-bin)"
[ -x "$BENCH" ] || die "no benchmark binary at $BENCH (build the bench_allreduce target)"
BENCH=$(cd "$(dirname "$BENCH")" && pwd)/$(basename "$BENCH")

remove_namespaces() {
  # Deleting a namespace deletes the veth end inside it, and with it the pair.
  ip netns del "$NS_A" 2>/dev/null || true
  ip netns del "$NS_B" 2>/dev/null || true
}
remove_namespaces  # leftovers of a killed run would make `ip netns add` fail
WORK=$(mktemp -d /tmp/tk_allreduce_netns.XXXXXX)
trap 'remove_namespaces; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

ip netns add "$NS_A"
ip netns add "$NS_B"
ip link add "$DEV_A" netns "$NS_A" type veth peer name "$DEV_B" netns "$NS_B"
ip -n "$NS_A" addr add "$ADDR_A/24" dev "$DEV_A"
ip -n "$NS_B" addr add "$ADDR_B/24" dev "$DEV_B"
for ns in "$NS_A" "$NS_B"; do ip -n "$ns" link set lo up; done
ip -n "$NS_A" link set "$DEV_A" up
ip -n "$NS_B" link set "$DEV_B" up

# The ssh stand-in: "agent HOST COMMAND..." runs COMMAND in HOST's namespace.
cat >"$WORK/agent" <<EOF
#!/bin/sh
host=\$1; shift
case "\$host" in
  $ADDR_A) ns=$NS_A ;;
  $ADDR_B) ns=$NS_B ;;
  *) echo "allreduce_netns agent: unknown host \$host" >&2; exit 1 ;;
esac
# Its own host name too (a UTS namespace): shared-memory segments are named after the host, and
# the ranks of two "hosts" must not meet in the same ones.
exec ip netns exec "\$ns" unshare --uts sh -c "hostname \$(echo \$ns | tr _ -); \$*"
EOF
chmod +x "$WORK/agent"
printf '%s slots=%s\n%s slots=%s\n' "$ADDR_A" "$RANKS_PER_HOST" "$ADDR_B" "$RANKS_PER_HOST" >"$WORK/hosts"
BTL=tcp,self
[ "$RANKS_PER_HOST" -gt 1 ] && BTL=${BTL_LOCAL:-tcp,self,vader}

for rate in $RATES; do
  # tbf: the rate, a bucket of ~1 ms of traffic (at least 64 KiB), and 50 ms of queue.
  case "$rate" in
    *gbit) burst=$(( ${rate%gbit} * 125000 )) ;;
    *mbit) burst=$(( ${rate%mbit} * 125 )) ;;
    *) die "rate '$rate' must be <N>gbit or <N>mbit" ;;
  esac
  [ "$burst" -ge 65536 ] || burst=65536
  tc -n "$NS_A" qdisc replace dev "$DEV_A" root tbf rate "$rate" burst "$burst" latency 50ms
  tc -n "$NS_B" qdisc replace dev "$DEV_B" root tbf rate "$rate" burst "$burst" latency 50ms
  echo "=== veth shaped to $rate each way (tbf burst $burst bytes); $RANKS_PER_HOST rank(s) in each of $NS_A and $NS_B ==="
  ip netns exec "$NS_A" mpirun --allow-run-as-root --oversubscribe --hostfile "$WORK/hosts" -np $((2 * RANKS_PER_HOST)) \
    --mca plm_rsh_agent "$WORK/agent" \
    --mca oob_tcp_if_include "$NET.0/24" \
    --mca btl "$BTL" --mca btl_tcp_if_include "$NET.0/24" \
    -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" \
    "$BENCH" "$@"
done
