#!/usr/bin/env python3
"""Reads event files trainkit wrote with the real TensorBoard, and checks tags, steps and values.

  read_tensorboard.py --known DIR
      DIR as written by `test_monitor "[.python]"` (TRAINKIT_TENSORBOARD_DIR=DIR):
      DIR/writer and DIR/logger hold known values (see that test case).
  read_tensorboard.py --jsonl FILE DIR
      DIR as written by an example run with --tensorboard DIR --metrics-log FILE: every JSON line's
      step has the same loss, learning rate, step count, samples and epoch in TensorBoard.
  read_tensorboard.py --jsonl FILE --every N --steps-log STEPS DIR
      and that run used --log-every N: a point every N steps (N, 2N, ... up to the run's last step,
      several of them), and each train/loss point is the mean of the N steps' losses weighted by
      their samples, taken from STEPS, the --metrics-log of the same run with --log-every 1 (one
      line per step; the run is deterministic, which its learning rates and sample counts confirm).

TensorBoard's own reader checks both CRCs of every record (tensorboard.compat's PyRecordReader),
so a framing or checksum mistake fails here even where the values would decode.
Exit status: 0 passed, 1 failed, 77 (CTest's SKIP_RETURN_CODE) without the tensorboard package.
"""
import argparse
import glob
import json
import math
import os
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.backend.event_processing import event_file_loader
except ImportError:
    print("SKIPPED: the tensorboard Python package is not installed (pip install tensorboard)")
    sys.exit(77)

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def close(a, b):
    """Equal as float32 (TensorBoard's simple_value is a float)."""
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-30)


def load(directory):
    files = sorted(glob.glob(os.path.join(directory, "events.out.tfevents.*")))
    check(len(files) >= 1, f"{directory}: no events.out.tfevents.* file")
    for path in files:
        # The first record of each file is the file_version event; every record passes the CRC checks.
        events = list(event_file_loader.EventFileLoader(path).Load())
        check(events and events[0].file_version == "brain.Event:2",
              f"{path}: the first record is not file_version brain.Event:2")
    acc = event_accumulator.EventAccumulator(directory, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return acc


def scalars(acc, tag):
    """{step: (wall_time, value)} of tag."""
    if tag not in acc.Tags()["scalars"]:
        check(False, f"tag {tag} missing (have {sorted(acc.Tags()['scalars'])})")
        return {}
    return {e.step: (e.wall_time, e.value) for e in acc.Scalars(tag)}


def check_known(directory):
    w = load(os.path.join(directory, "writer"))
    check(sorted(w.Tags()["scalars"]) == ["test/constant", "test/sine"], f"writer tags: {w.Tags()['scalars']}")
    sine = scalars(w, "test/sine")
    check(sorted(sine) == list(range(10)), f"test/sine steps {sorted(sine)}")
    for step, (wall, value) in sine.items():
        check(close(value, math.sin(0.5 * step)), f"test/sine at {step}: {value}")
        check(wall == 1700000000.0 + step, f"test/sine wall_time at {step}: {wall}")
    const = scalars(w, "test/constant")
    check(sorted(const) == [0, 5] and all(v == 0.25 for _, v in const.values()), f"test/constant: {const}")

    lg = load(os.path.join(directory, "logger"))
    tags = set(lg.Tags()["scalars"])
    for t in ["train/loss", "train/learning_rate", "train/loss_scale", "train/steps", "train/samples",
              "train/epoch", "train/skipped_steps", "perf/samples_per_second", "perf/step_seconds",
              "perf/data_wait_seconds", "comm/seconds", "comm/time_ratio", "comm/bytes_sent",
              "memory/allocated_bytes/device=cpu", "memory/peak_bytes/device=cpu"]:
        check(t in tags, f"logger tag {t} missing")
    for step in (1, 2, 3):
        expect = {"train/loss": 1.0 / step, "train/learning_rate": 0.01 * step, "train/steps": step,
                  "train/samples": 16 * step, "train/epoch": step, "perf/step_seconds": 0.125 * step,
                  "perf/samples_per_second": 16 / (0.125 * step), "train/loss_scale": 1.0}
        for tag, want in expect.items():
            got = scalars(lg, tag).get(step)
            check(got is not None and close(got[1], want), f"{tag} at step {step}: {got} != {want}")


def check_against_jsonl(directory, jsonl):
    with open(jsonl) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    check(len(lines) >= 1, f"{jsonl}: no lines")
    acc = load(directory)
    pairs = {"trainkit_loss": "train/loss", "trainkit_learning_rate": "train/learning_rate",
             "trainkit_steps_total": "train/steps", "trainkit_samples_total": "train/samples",
             "trainkit_epoch": "train/epoch", "trainkit_loss_scale": "train/loss_scale",
             "trainkit_skipped_steps_total": "train/skipped_steps"}
    for name, tag in pairs.items():
        series = scalars(acc, tag)
        check(sorted(series) == sorted(int(line["step"]) for line in lines),
              f"{tag}: steps {sorted(series)} != the log's {[line['step'] for line in lines]}")
        for line in lines:
            got = series.get(int(line["step"]))
            check(got is not None and close(got[1], line[name]),
                  f"{tag} at step {line['step']}: {got} != {name} {line[name]}")
            check(got is None or abs(got[0] - line["time"]) < 60, f"{tag} wall_time {got} far from {line['time']}")
    for tag in ["perf/samples_per_second", "perf/step_seconds", "memory/peak_bytes/device=cpu"]:
        check(len(scalars(acc, tag)) == len(lines), f"{tag}: not one point per log line")
    return len(lines)


def check_intervals(directory, every, steps_log):
    with open(steps_log) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    numbers = [int(line["step"]) for line in steps]
    check(numbers == list(range(1, len(steps) + 1)), f"{steps_log}: not one line per step: {numbers}")
    total = len(steps)
    want = list(range(every, total + 1, every))
    check(len(want) >= 2, f"{total} steps, --log-every {every}: fewer than 2 points to check")
    acc = load(directory)
    loss = scalars(acc, "train/loss")
    check(sorted(loss) == want, f"train/loss at steps {sorted(loss)}, want {want} ({total} steps / {every})")
    samples = [line["trainkit_samples_total"] for line in steps]
    per_step = [b - a for a, b in zip([0] + samples, samples)]
    differs = False  # some interval's mean is not its last step's loss (else the check proves little)
    for end in want:
        lo = end - every
        weights = per_step[lo:end]
        mean = sum(line["trainkit_loss"] * w for line, w in zip(steps[lo:end], weights)) / sum(weights)
        got = loss.get(end)
        check(got is not None and close(got[1], mean),
              f"train/loss at step {end}: {got} != the mean of steps {lo + 1}..{end}: {mean}")
        differs = differs or not close(mean, steps[end - 1]["trainkit_loss"])
        for tag, name in [("train/learning_rate", "trainkit_learning_rate"), ("train/samples", "trainkit_samples_total"),
                          ("train/steps", "trainkit_steps_total")]:
            point = scalars(acc, tag).get(end)
            check(point is not None and close(point[1], steps[end - 1][name]),
                  f"{tag} at step {end}: {point} != {name} {steps[end - 1][name]} of the per-step run")
        rate = scalars(acc, "perf/samples_per_second").get(end)
        check(rate is not None and rate[1] > 0, f"perf/samples_per_second at step {end}: {rate}")
    check(differs, "every interval's mean loss equals its last step's loss: not an interval mean")
    return len(want), total


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--known", action="store_true", help="DIR holds test_tensorboard's known values")
    g.add_argument("--jsonl", help="the JSON-lines log of the same run")
    p.add_argument("--every", type=int, help="with --jsonl: the run's --log-every")
    p.add_argument("--steps-log", help="with --every: the --metrics-log of the same run with --log-every 1")
    a = p.parse_args()
    if (a.every is None) != (a.steps_log is None) or (a.every is not None and not a.jsonl):
        p.error("--every and --steps-log go together, with --jsonl")
    if a.known:
        check_known(a.dir)
        what = "known values"
    else:
        what = f"{check_against_jsonl(a.dir, a.jsonl)} logged step(s) against {a.jsonl}"
        if a.every is not None:
            points, total = check_intervals(a.dir, a.every, a.steps_log)
            what += f", {points} interval means of {a.every} of {total} steps against {a.steps_log}"
    if failures:
        print(f"read_tensorboard: {len(failures)} check(s) failed")
        return 1
    print(f"read_tensorboard: OK, {what} read back by TensorBoard")
    return 0


if __name__ == "__main__":
    sys.exit(main())
