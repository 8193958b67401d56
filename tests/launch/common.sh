# tests/launch/common.sh - what the trainkit-run fault tests share (sourced; $work set by the caller):
# a 2 s communicator timeout, one thread per rank, fail, now, a fresh work directory, and the
# check that a job left no shared memory and no Open MPI session directory behind.
timeout_ms=2000
export TRAINKIT_DIST_TIMEOUT_MS=$timeout_ms OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
rm -rf "$work"
mkdir -p "$work"
# Open MPI's shared-memory segments (btl/vader, /dev/shm by default) and session directories (/tmp)
# go to directories of this test only, so that what a job leaves there is this job's, whatever
# other tests run beside it: shm_dir (still in /dev/shm) and $work/ompi-tmp. mpirun passes these
# OMPI_MCA_ variables on to its daemons on every host, srun to every task.
shm_dir="/dev/shm/trainkit-$(basename "$work")"
rm -rf "$shm_dir"
mkdir -p "$shm_dir" "$work/ompi-tmp"
export OMPI_MCA_btl_vader_backing_directory="$shm_dir" OMPI_MCA_orte_tmpdir_base="$work/ompi-tmp"
trap 'rm -rf "$shm_dir"' EXIT
# no_leftovers <case>: no shared-memory segment and no session directory of a job is left.
no_leftovers() {
  local left
  left=$(find "$shm_dir" "$work/ompi-tmp" -mindepth 1 \( -type f -o -name 'pid.*' -o -name 'jf.*' \) 2>/dev/null | head -5)
  if [[ -n "$left" ]]; then
    echo "$left"
    fail "$1: the job left shared memory or an Open MPI session directory behind"
  fi
}
