#!/usr/bin/env python3
"""tests/monitor/check_progress_tty.py - an example's live progress line, read off a terminal.

Runs the example twice: under a pseudo-terminal (script(1) from util-linux; its stdout is a tty)
and with stdout piped. On the terminal the progress line must be drawn in place (carriage
returns, "N/TOTAL", ETA, samples/s, mem) and the screen it leaves - the bytes replayed through
carriage return and erase-to-end-of-line as a terminal would - must hold the per-epoch lines and
no stale bar; in the pipe there must be no carriage return at all.

  check_progress_tty.py <example> <args...>
Exit status 0 when both hold, 1 otherwise (the reason printed), 77 (skipped) without script(1).
"""
import os
import re
import shlex
import shutil
import subprocess
import sys


def screen(raw: str) -> list:
    """The lines a terminal shows after `raw`: \\r returns to column 0, ESC[K erases to the end."""
    lines, cur, col = [], [], 0
    i = 0
    while i < len(raw):
        c = raw[i]
        if raw.startswith("\x1b[K", i):
            del cur[col:]
            i += 3
            continue
        if c == "\r":
            col = 0
        elif c == "\n":
            lines.append("".join(cur))
            cur, col = [], 0
        else:
            if col < len(cur):
                cur[col] = c
            else:
                cur.append(c)
            col += 1
        i += 1
    if cur:
        lines.append("".join(cur))
    return lines


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    script = shutil.which("script")
    if script is None:
        print("SKIPPED: script(1) (util-linux) is not installed")
        return 77
    cmd = sys.argv[1:]
    env = dict(os.environ, TERM="xterm", COLUMNS="120")
    # Bytes, decoded by hand: text mode's universal newlines would turn every \r into \n.
    tty = subprocess.run([script, "-qefc", shlex.join(cmd), "/dev/null"], env=env, capture_output=True,
                         timeout=600)
    if tty.returncode != 0:
        print(f"FAIL: under a terminal the example exited {tty.returncode}:\n{tty.stdout!r}\n{tty.stderr!r}")
        return 1
    raw = tty.stdout.decode("utf-8", errors="replace")
    problems = []
    if "\r" not in raw.replace("\r\n", "\n"):
        problems.append("no carriage return: the line was not drawn in place")
    for pattern in (r"\d+/\d+", r"ETA \d+:\d\d", r"samples/s", r"mem \d+\.\d MiB", r"loss \d"):
        if not re.search(pattern, raw):
            problems.append(f"the progress line never showed /{pattern}/")
    shown = screen(raw.replace("\r\n", "\n"))
    epochs = [l for l in shown if l.startswith("epoch ") and "test accuracy" in l]
    if not epochs:
        problems.append("the screen holds no per-epoch line")
    stale = [l for l in shown if "ETA" in l]
    if stale:
        problems.append(f"a progress line was left on the screen: {stale[-1]!r}")

    piped = subprocess.run(cmd, env=env, capture_output=True, timeout=600)
    piped_out = piped.stdout.decode("utf-8", errors="replace")
    if piped.returncode != 0:
        problems.append(f"piped, the example exited {piped.returncode}: {piped.stderr!r}")
    if "\r" in piped_out or "ETA" in piped_out:
        problems.append("piped output holds a progress line (it must be plain lines)")
    if not any(l.startswith("epoch ") for l in piped_out.split("\n")):
        problems.append("piped output has no per-epoch line")

    print("screen after the run:")
    for l in shown:
        print("  | " + l)
    for p in problems:
        print("FAIL: " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
