#!/usr/bin/env python3
"""Side-by-side: the same training steps in PyTorch (CPU) and trainkit, in one run, same threads.

Prints time per step of each and the ratio trainkit / PyTorch (lower is better; goal: MLP <= 1.0,
CNN <= 1.5), plus trainkit's matmul against raw cblas_sgemm (goal >= 0.9 of sgemm's speed).
    python3 benchmarks/compare_pytorch.py [--build build] [--threads 2]
Needs `pip install torch` and a build with benchmarks (bench_train_step, bench_gemm).
"""
import argparse
import json
import os
import subprocess
import sys
import time


def run_bench(exe, flt, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([exe, f"--benchmark_filter={flt}", "--benchmark_format=json",
                          "--benchmark_min_time=1", "--benchmark_repetitions=3",
                          "--benchmark_report_aggregates_only=true"],
                         check=True, capture_output=True, text=True, env=env).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            res[b["run_name"].split("/real_time")[0]] = b["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1}[b["time_unit"]]
    return res


def torch_steps(threads):
    import torch
    import torch.nn as nn
    torch.set_num_threads(threads)
    torch.manual_seed(0)

    def timed(model, x, y, opt, reps=3, min_time=1.0):
        loss_fn = nn.CrossEntropyLoss()

        def step():
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        for _ in range(5):
            step()
        times = []
        for _ in range(reps):
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < min_time:
                step()
                n += 1
            times.append((time.perf_counter() - t0) / n)
        return sorted(times)[len(times) // 2]

    mlp = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
    t_mlp = timed(mlp, x, y, torch.optim.SGD(mlp.parameters(), lr=0.01, momentum=0.9))
    cnn = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    xc = torch.randn(128, 1, 28, 28)
    t_cnn = timed(cnn, xc, y, torch.optim.SGD(cnn.parameters(), lr=0.01, momentum=0.9))
    return t_mlp, t_cnn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    bench = os.path.join(a.build, "benchmarks")
    tk = run_bench(os.path.join(bench, "bench_train_step"), "bm_(mlp|cnn)_step", a.threads)
    t_mlp, t_cnn = torch_steps(a.threads)
    g = run_bench(os.path.join(bench, "bench_gemm"), "bm_(cblas_sgemm|trainkit_matmul)/", a.threads)
    print(f"threads: {a.threads}")
    print(f"{'step':<28}{'pytorch ms':>12}{'trainkit ms':>13}{'ratio':>8}")
    for name, t_torch in (("mlp 784-512-512-10 b128", t_mlp), ("cnn 2 conv blocks b128", t_cnn)):
        key = "bm_mlp_step" if name.startswith("mlp") else "bm_cnn_step"
        t = tk[key]
        print(f"{name:<28}{t_torch * 1e3:>12.3f}{t * 1e3:>13.3f}{t / t_torch:>8.2f}")
    print(f"{'gemm M/N/K':<28}{'sgemm ms':>12}{'matmul ms':>13}{'speed':>8}")
    for k, v in sorted(g.items()):
        if k.startswith("bm_cblas_sgemm/"):
            shape = k.split("/", 1)[1]
            m = g.get("bm_trainkit_matmul/" + shape)
            if m:
                print(f"{shape:<28}{v * 1e3:>12.3f}{m * 1e3:>13.3f}{v / m:>8.2f}")


if __name__ == "__main__":
    sys.exit(main())
