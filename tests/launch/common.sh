# tests/launch/common.sh - what the trainkit-run fault tests share (sourced; $work set by the caller):
# a 2 s communicator timeout, one thread per rank, fail, now, and a fresh work directory.
timeout_ms=2000
export TRAINKIT_DIST_TIMEOUT_MS=$timeout_ms OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
rm -rf "$work"
mkdir -p "$work"
