#!/bin/sh
# allreduce_netns.sh - bench_allreduce (or any MPI program) on HOSTS "hosts" (default 2, up to 8)
# across slow links: network namespaces on this machine - two joined by a veth pair, more by veth
# pairs to a bridge in a switch namespace - each host's link shaped with tc (tbf, both directions)
# to 1 Gbit/s and then to 10 Gbit/s, with RANKS_PER_HOST ranks on each (default 1). Everything it
# creates (namespaces, veths, bridge, hostfile) is removed when it exits, also on error or Ctrl-C.
# Needs root (ip netns, tc) and OpenMPI's mpirun.
#
#   sudo benchmarks/allreduce_netns.sh [BENCH [bench args...]]
#   sudo benchmarks/allreduce_netns.sh build/benchmarks/bench_allreduce --sizes=25
#   RATES="1gbit" sudo benchmarks/allreduce_netns.sh      (rates to run; default "1gbit 10gbit")
#   TCP_LINKS=1 ...      (Open MPI's TCP connections per pair of ranks; default 2, full duplex)
#   TBF_LATENCY=5ms ...  (the shaper's queue; default 50ms)
#   RANKS_PER_HOST=2 sudo benchmarks/allreduce_netns.sh build/benchmarks/bench_allreduce --sizes=25 --hierarchical
#       2 hosts x 2 ranks: the ranks of a host talk through shared memory (btl vader), the hosts
#       through the shaped veth; --hierarchical compares compression::hierarchical with the flat allreduces
#   HOSTS=3 RANKS_PER_HOST=2 sudo benchmarks/allreduce_netns.sh build/examples/fashion_mnist_ddp --hierarchical 1 ...
#
# How the ranks land in different namespaces: mpirun itself runs in host 0's namespace and sees a
# hostfile of the hosts' addresses. Host 0's address is local, so its ranks start as mpirun's
# children; for every other host mpirun calls its rsh agent - here a short script that runs the
# daemon command under `ip netns exec <host>` (with the host's own name, in a UTS namespace)
# instead of ssh. Both the daemons' control traffic and the ranks' data (btl tcp, restricted to the
# hosts' subnet) then cross the shaped links; shared memory is used only between the ranks of one
# "host" (RANKS_PER_HOST > 1), as it would be on real machines.
set -eu

BENCH=${1:-build/benchmarks/bench_allreduce}
[ $# -gt 0 ] && shift
RATES=${RATES:-"1gbit 10gbit"}
RANKS_PER_HOST=${RANKS_PER_HOST:-1}
HOSTS=${HOSTS:-2}
TBF_LATENCY=${TBF_LATENCY:-50ms}
# Open MPI's TCP transport over one connection per pair of ranks carries one direction at a time
# (12.5 MiB each way at once: 232 ms on 1 Gbit/s, one way: 120 ms; iperf3 --bidir on the same link:
# 955 Mbit/s both ways); two connections per pair (btl_tcp_links 2) make it full duplex (124 ms).
TCP_LINKS=${TCP_LINKS:-2}
NET=10.231.77
PREFIX=tk_allreduce
[ "$HOSTS" -ge 2 ] && [ "$HOSTS" -le 8 ] || { echo "allreduce_netns.sh: HOSTS must be 2..8, got $HOSTS" >&2; exit 1; }
ns_of() { if [ "$HOSTS" -eq 2 ]; then [ "$1" -eq 0 ] && echo ${PREFIX}_a || echo ${PREFIX}_b; else echo ${PREFIX}_h$1; fi; }
dev_of() { if [ "$HOSTS" -eq 2 ]; then [ "$1" -eq 0 ] && echo tk_ar_a || echo tk_ar_b; else echo tk_ar_h$1; fi; }
addr_of() { echo "$NET.$(($1 + 1))"; }
NS_SW=${PREFIX}_sw  # HOSTS > 2: the switch (a bridge) every host's link goes to

die() { echo "allreduce_netns.sh: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || die "needs root (network namespaces, tc)"
command -v ip >/dev/null || die "needs ip (iproute2)"
command -v tc >/dev/null || die "needs tc (iproute2)"
command -v mpirun >/dev/null || die "needs mpirun (openmpi-bin)"
[ -x "$BENCH" ] || die "no benchmark binary at $BENCH (build the bench_allreduce target)"
BENCH=$(cd "$(dirname "$BENCH")" && pwd)/$(basename "$BENCH")

remove_namespaces() {
  # Deleting a namespace deletes the veth ends inside it, and with them the pairs.
  for ns in ${PREFIX}_a ${PREFIX}_b ${PREFIX}_h0 ${PREFIX}_h1 ${PREFIX}_h2 ${PREFIX}_h3 ${PREFIX}_h4 ${PREFIX}_h5 \
            ${PREFIX}_h6 ${PREFIX}_h7 "$NS_SW"; do
    ip netns del "$ns" 2>/dev/null || true
  done
}
remove_namespaces  # leftovers of a killed run would make `ip netns add` fail
WORK=$(mktemp -d /tmp/tk_allreduce_netns.XXXXXX)
trap 'remove_namespaces; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

h=0
while [ $h -lt "$HOSTS" ]; do ip netns add "$(ns_of $h)"; ip -n "$(ns_of $h)" link set lo up; h=$((h + 1)); done
if [ "$HOSTS" -eq 2 ]; then
  # Two hosts: one veth pair between them.
  ip link add "$(dev_of 0)" netns "$(ns_of 0)" type veth peer name "$(dev_of 1)" netns "$(ns_of 1)"
else
  # More: each host's veth goes to a bridge in the switch namespace (its end there is tk_sw<i>).
  ip netns add "$NS_SW"
  ip -n "$NS_SW" link add br0 type bridge
  ip -n "$NS_SW" link set br0 up
  h=0
  while [ $h -lt "$HOSTS" ]; do
    ip link add "$(dev_of $h)" netns "$(ns_of $h)" type veth peer name "tk_sw$h" netns "$NS_SW"
    ip -n "$NS_SW" link set "tk_sw$h" master br0
    ip -n "$NS_SW" link set "tk_sw$h" up
    h=$((h + 1))
  done
fi
: >"$WORK/hosts"
h=0
while [ $h -lt "$HOSTS" ]; do
  ip -n "$(ns_of $h)" addr add "$(addr_of $h)/24" dev "$(dev_of $h)"
  ip -n "$(ns_of $h)" link set "$(dev_of $h)" up
  printf '%s slots=%s\n' "$(addr_of $h)" "$RANKS_PER_HOST" >>"$WORK/hosts"
  h=$((h + 1))
done

# The ssh stand-in: "agent HOST COMMAND..." runs COMMAND in HOST's namespace.
{
  echo '#!/bin/sh'
  echo 'host=$1; shift'
  echo 'case "$host" in'
  h=0
  while [ $h -lt "$HOSTS" ]; do echo "  $(addr_of $h)) ns=$(ns_of $h) ;;"; h=$((h + 1)); done
  echo '  *) echo "allreduce_netns agent: unknown host $host" >&2; exit 1 ;;'
  echo 'esac'
  echo '# Its own host name too (a UTS namespace): shared-memory segments are named after the host, and'
  echo '# the ranks of two "hosts" must not meet in the same ones.'
  echo 'exec ip netns exec "$ns" unshare --uts sh -c "hostname $(echo $ns | tr _ -); $*"'
} >"$WORK/agent"
chmod +x "$WORK/agent"
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
  # Every host's link, both ways: its egress in the host, and (HOSTS > 2) the switch port's egress.
  h=0
  while [ $h -lt "$HOSTS" ]; do
    tc -n "$(ns_of $h)" qdisc replace dev "$(dev_of $h)" root tbf rate "$rate" burst "$burst" latency "$TBF_LATENCY"
    [ "$HOSTS" -gt 2 ] && tc -n "$NS_SW" qdisc replace dev "tk_sw$h" root tbf rate "$rate" burst "$burst" latency "$TBF_LATENCY"
    h=$((h + 1))
  done
  echo "=== $HOSTS hosts, each link shaped to $rate each way (tbf burst $burst bytes); $RANKS_PER_HOST rank(s) per host ==="
  # TRAINKIT_RUN=tools/trainkit-run: the job goes through trainkit's launcher (on this mpirun), and
  # the script's status is the job's (tests/launch/trainkit_run_hosts.sh).
  set +e
  if [ -n "${TRAINKIT_RUN:-}" ]; then
    ip netns exec "$(ns_of 0)" "$TRAINKIT_RUN" --allow-run-as-root --oversubscribe --hostfile "$WORK/hosts" \
      -np $((HOSTS * RANKS_PER_HOST)) --mca plm_rsh_agent "$WORK/agent" --mca oob_tcp_if_include "$NET.0/24" \
      --mca btl "$BTL" --mca btl_tcp_if_include "$NET.0/24" --mca btl_tcp_links "$TCP_LINKS" -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" -x TRAINKIT_BENCH_LINK="$rate" \
      -- "$BENCH" "$@"
  else
    ip netns exec "$(ns_of 0)" mpirun --allow-run-as-root --oversubscribe --hostfile "$WORK/hosts" -np $((HOSTS * RANKS_PER_HOST)) \
      --mca plm_rsh_agent "$WORK/agent" \
      --mca oob_tcp_if_include "$NET.0/24" \
      --mca btl "$BTL" --mca btl_tcp_if_include "$NET.0/24" --mca btl_tcp_links "$TCP_LINKS" \
      -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" -x TRAINKIT_BENCH_LINK="$rate" \
      "$BENCH" "$@"
  fi
  rc=$?
  set -e
  [ "$rc" -eq 0 ] || exit "$rc"
done
