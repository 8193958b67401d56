#!/bin/sh
# example_help.sh <example>... - ctest example_help: every example's --help exits 0 and follows each
# "  --name [default]" line with its description (example::flag_help()).
bad=0
for exe in "$@"; do
  if ! out=$("$exe" --help 2>&1); then echo "FAIL: $exe --help exited non-zero: $out"; bad=1; continue; fi
  flags=$(printf '%s\n' "$out" | grep -c '^  --')
  described=$(printf '%s\n' "$out" | grep -A1 '^  --' | grep -c '^      [a-z0-9]')
  if [ "$flags" -gt 0 ] && [ "$flags" -eq "$described" ]; then
    echo "ok: $exe: $flags flags, each described"
  else
    echo "FAIL: $exe: $flags flags, $described described:"; echo "$out"; bad=1
  fi
done
exit $bad
