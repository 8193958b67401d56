#!/usr/bin/env bash
# tests/drivers/example_resume_guard.sh <example> <data dir> <work dir> - the resume guard rails, end to end
# (ctest example_resume_guard): --resume (= 1) on a mistyped directory and on a directory whose
# only snapshot is damaged is an error that names the directory and keeps the damaged file aside
# (renamed *.damaged, never overwritten); --resume auto starts from scratch there; a resume with
# another --batch is an error naming the difference with --resume 1 and a warning with auto.
set -u
exe="$1"; data="$2"; work="$3"
rm -rf "$work"; mkdir -p "$work"
args=(--data "$data" --epochs 1 --train-limit 512 --test-limit 128)
bad=0
expect() {  # expect <want rc: 0 | nonzero> <text in stderr> <args...>
  local want="$1" text="$2"; shift 2
  "$exe" "${args[@]}" "$@" > "$work/out" 2> "$work/err"; local rc=$?
  if { [[ $want == 0 && $rc == 0 ]] || [[ $want != 0 && $rc != 0 ]]; } && grep -qF -- "$text" "$work/err"; then
    echo "ok: $* -> exit $rc: $text"
  else
    echo "FAIL: $* -> exit $rc, wanted exit $want and '$text'; stderr:"; cat "$work/err"; bad=1
  fi
}
expect 1 "no usable snapshot in '$work/typo' (the directory did not exist" --snapshot-dir "$work/typo" --resume
[[ ! -e "$work/typo" ]] && echo "ok: the mistyped directory was not created" || { echo "FAIL: $work/typo was created"; bad=1; }
expect 0 "starting from scratch" --snapshot-dir "$work/auto" --resume auto

# A finished run leaves its final snapshot; damage it (truncate) and resume.
"$exe" "${args[@]}" --snapshot-dir "$work/run" > /dev/null 2>&1 || { echo "FAIL: the first run"; exit 1; }
snap="$(ls "$work/run"/snapshot-*.tks | tail -1)"
cp "$snap" "$work/good.tks"
truncate -s 100 "$snap"
expect 1 "no usable snapshot in '$work/run'" --snapshot-dir "$work/run" --resume
if [[ -f "$snap.damaged" && ! -f "$snap" ]]; then echo "ok: the damaged snapshot was kept as $(basename "$snap").damaged"
else echo "FAIL: $snap.damaged missing or $snap still there"; ls -l "$work/run"; bad=1; fi
expect 1 "set aside earlier as damaged: $snap.damaged" --snapshot-dir "$work/run" --resume
expect 0 "starting from scratch" --snapshot-dir "$work/run" --resume auto
[[ -f "$snap.damaged" && $(stat -c %s "$snap.damaged") == 100 ]] && echo "ok: the damaged file is untouched" \
  || { echo "FAIL: the damaged file changed"; bad=1; }

# Another batch size than the snapshot's.
rm -f "$work/run"/snapshot-*.tks; cp "$work/good.tks" "$snap"
expect 1 "batch: snapshot '128', now '64'" --snapshot-dir "$work/run" --resume --batch 64
expect 0 "warning: this run differs" --snapshot-dir "$work/run" --resume auto --batch 64
exit $bad
