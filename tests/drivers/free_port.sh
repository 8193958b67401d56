# shellcheck shell=bash
# tests/drivers/free_port.sh - sourced by the tests that start services (example_prometheus.sh,
# tests/launch/slurm.sh). (No shebang: a library of functions.)

# free_port: prints a TCP port nothing listens on (ss lists the listening ones); fails after 100 tries.
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 40000))
    ss -ltn 2>/dev/null | grep -q ":$p " || { echo "$p"; return; }
  done
  return 1
}
