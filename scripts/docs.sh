#!/usr/bin/env bash
# scripts/docs.sh [OUTPUT_DIR] - build the HTML API reference with docs/Doxyfile and fail on any
# Doxygen warning.
#
#   scripts/docs.sh build/docs      # -> build/docs/html/index.html (default: build/docs)
#
# Exit status: 0 when Doxygen ran without a single warning; 77 (and "SKIPPED: ...") when doxygen
# is not installed (Debian: apt-get install doxygen); 1 otherwise, with the warnings printed.
# The Doxyfile already sets WARN_AS_ERROR=FAIL_ON_WARNINGS; this script also fails when anything
# at all is written to stderr, so a warning cannot slip through a Doxygen that ignores that tag.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/build/docs}"

if ! command -v "${DOXYGEN:-doxygen}" >/dev/null 2>&1; then
  echo "SKIPPED: doxygen not installed (Debian: apt-get install doxygen)"
  exit 77
fi
doxygen="$(command -v "${DOXYGEN:-doxygen}")"

mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/doxygen-warnings.log"
rm -rf "$out/html"

echo "docs: $("$doxygen" --version | head -n1) -> $out/html"
rc=0
# The Doxyfile's paths are relative to the repository root.
(cd "$root" && TRAINKIT_DOCS_OUTPUT="$out" "$doxygen" docs/Doxyfile) 2>"$log" || rc=$?

if [[ -s "$log" ]]; then
  count="$(grep -c . "$log" || true)"
  cat "$log" >&2
  echo "docs: FAILED: doxygen printed $count warning/error line(s) (see $log)" >&2
  exit 1
fi
if ((rc != 0)); then
  echo "docs: FAILED: doxygen exited with status $rc" >&2
  exit 1
fi
if [[ ! -f "$out/html/index.html" ]]; then
  echo "docs: FAILED: $out/html/index.html was not written" >&2
  exit 1
fi
echo "docs: 0 warnings; open $out/html/index.html"
