#!/usr/bin/env python3
"""Side-by-side: the same training steps in PyTorch (CPU) and trainkit, in one run, same threads.

Prints time per step of each and the ratio trainkit / PyTorch (lower is better; goal: MLP <= 1.0,
CNN <= 1.5), plus trainkit's matmul against raw cblas_sgemm (goal >= 0.9 of sgemm's speed).
With --precision it also times train_step under fp32, bf16 and fp16 for the MLP, the CNN and the
residual network of examples/common/resnet.hpp, against PyTorch's CPU autocast (torch.autocast
"cpu" with bfloat16/float16) on the same models, and prints each mixed step's speed-up over its
own fp32 step (issue goals: bf16 >= 1.5x trainkit's fp32 and <= 1.0x PyTorch's bf16 step; fp32 CNN
<= 0.8x and MLP <= 0.9x PyTorch's; fp16 <= 1.2x trainkit's fp32 time).
    python3 benchmarks/compare_pytorch.py [--build build] [--threads 2] [--precision] [--rounds 3]
--rounds N repeats the whole comparison N times (interleaved) and prints each ratio's median and
range: the machines are noisy. --emulate-avx2 makes an AVX-512 machine run an AVX2-only machine's
kernels in every library on both sides (AVX2_ENVIRONMENT below). Needs `pip install torch` and a build with benchmarks
(bench_train_step, bench_gemm). The first line names the CPU (model and flags).
With --attention it times scaled_dot_product_attention forward + backward instead (bench_attention:
fp32 and bf16, [4, 8, T, 64], T = 256 and 1024, causal and not) against
torch.nn.functional.scaled_dot_product_attention on the same shapes (issue goal: <= 1.0x).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time


def run_bench(exe, flt, threads, counter=None):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    out = subprocess.run([exe, f"--benchmark_filter={flt}", "--benchmark_format=json",
                          "--benchmark_min_time=1", "--benchmark_repetitions=3",
                          "--benchmark_report_aggregates_only=true"],
                         check=True, capture_output=True, text=True, env=env).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        if b.get("aggregate_name") == "median":
            name = b["run_name"].split("/real_time")[0]
            res[name] = b["real_time"] * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1}[b["time_unit"]]
            if counter and counter in b:
                res[name + ":" + counter] = b[counter]
    return res


def median_seconds(step, warmup, reps, min_time):
    """Median over reps of the seconds per call of step(), each rep calling it for min_time."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min_time:
            step()
            n += 1
        times.append((time.perf_counter() - t0) / n)
    return sorted(times)[len(times) // 2]


def timed(model, x, y, opt, dtype=None, reps=3, min_time=1.0):
    """Median seconds per SGD step of model on (x, y), under torch.autocast("cpu", dtype) if given."""
    import torch
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return median_seconds(step, warmup=5, reps=reps, min_time=min_time)


def torch_steps(threads):
    import torch
    import torch.nn as nn
    torch.set_num_threads(threads)
    torch.manual_seed(0)

    mlp = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
    x, y = torch.randn(128, 784), torch.randint(0, 10, (128,))
    t_mlp = timed(mlp, x, y, torch.optim.SGD(mlp.parameters(), lr=0.01, momentum=0.9))
    cnn = nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))
    xc = torch.randn(128, 1, 28, 28)
    t_cnn = timed(cnn, xc, y, torch.optim.SGD(cnn.parameters(), lr=0.01, momentum=0.9))
    return t_mlp, t_cnn


def conv_bn(i, o):
    import torch.nn as nn
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())


def resnet(channels=1, width=16, classes=10):
    """examples/common/resnet.hpp in PyTorch."""
    import torch.nn as nn

    class Residual(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.a, self.b = conv_bn(c, c), conv_bn(c, c)

        def forward(self, x):
            return x + self.b(self.a(x))

    class Stage(nn.Module):
        def __init__(self, i, o, res):
            super().__init__()
            self.conv, self.pool = conv_bn(i, o), nn.MaxPool2d(2)
            self.res = Residual(o) if res else None

        def forward(self, x):
            h = self.pool(self.conv(x))
            return self.res(h) if self.res is not None else h

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            w = width
            self.prep = conv_bn(channels, w)
            self.l1, self.l2, self.l3 = Stage(w, 2 * w, True), Stage(2 * w, 4 * w, False), Stage(4 * w, 8 * w, True)
            self.fc = nn.Linear(8 * w, classes)

        def forward(self, x):
            return self.fc(self.l3(self.l2(self.l1(self.prep(x)))).mean((2, 3))) * 0.125
    return Net()


def torch_precision_steps(threads):
    """PyTorch step times {(model, precision): seconds} under torch.autocast on the CPU."""
    import torch
    import torch.nn as nn
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    y = torch.randint(0, 10, (128,))
    models = {
        "mlp": (lambda: nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                      nn.Linear(512, 10)), torch.randn(128, 784)),
        "cnn": (lambda: nn.Sequential(nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10)),
                torch.randn(128, 1, 28, 28)),
        "resnet": (resnet, torch.randn(128, 1, 28, 28)),
    }
    out = {}
    for name, (make, x) in models.items():
        for prec, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
            model = make()
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            out[(name, prec)] = timed(model, x, y, opt, dtype)
    return out


def precision_round(bench, threads):
    """One interleaved round: trainkit's bm_step rows, then PyTorch's; returns the ratios."""
    tk = run_bench(os.path.join(bench, "bench_train_step"), "bm_step/", threads, counter="peak_MiB")
    pt = torch_precision_steps(threads)
    rows = {}
    for model in ("mlp", "cnn", "resnet"):
        t = {p: tk[f"bm_step/{model}/{p}"] for p in ("fp32", "bf16", "fp16")}
        rows[model] = {
            "tk fp32 ms": t["fp32"] * 1e3, "tk bf16 ms": t["bf16"] * 1e3, "tk fp16 ms": t["fp16"] * 1e3,
            "pt fp32 ms": pt[(model, "fp32")] * 1e3, "pt bf16 ms": pt[(model, "bf16")] * 1e3,
            "fp32 tk/pt": t["fp32"] / pt[(model, "fp32")],
            "bf16 tk/pt": t["bf16"] / pt[(model, "bf16")],
            "bf16 speed-up": t["fp32"] / t["bf16"],
            "fp16/fp32 time": t["fp16"] / t["fp32"],
            "bf16/fp32 peak": tk[f"bm_step/{model}/bf16:peak_MiB"] / tk[f"bm_step/{model}/fp32:peak_MiB"],
        }
    return rows


def print_precision(rounds, threads):
    cols = list(rounds[0]["mlp"].keys())
    print(f"threads: {threads}  rounds: {len(rounds)}; each cell: median (min-max) over the rounds; batch 128")
    print(f"{'':<8}" + "".join(f"{c:>22}" for c in cols))
    for model in ("mlp", "cnn", "resnet"):
        cells = []
        for c in cols:
            v = sorted(r[model][c] for r in rounds)
            med = v[len(v) // 2]
            cells.append(f"{med:.2f} ({v[0]:.2f}-{v[-1]:.2f})" if len(v) > 1 else f"{med:.2f}")
        print(f"{model:<8}" + "".join(f"{c:>22}" for c in cells))


def torch_attention(threads, reps=3, min_time=1.0):
    """Seconds per forward + backward of torch's scaled_dot_product_attention per (T, causal, bf16):
    fp32 tensors, and bf16 tensors (what torch.autocast hands it)."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    out = {}
    for t in (256, 1024):
        for causal in (0, 1):
            for bf16 in (0, 1):
                g = torch.Generator().manual_seed(7)
                dtype = torch.bfloat16 if bf16 else torch.float32
                q, k, v, go = (torch.randn(4, 8, t, 64, generator=g).to(dtype) for _ in range(4))
                q.requires_grad_(), k.requires_grad_(), v.requires_grad_()

                def step():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                    o.backward(go)
                    q.grad = k.grad = v.grad = None
                out[(t, causal, bf16)] = median_seconds(step, warmup=3, reps=reps, min_time=min_time)
    return out


def attention_round(bench, threads):
    tk = run_bench(os.path.join(bench, "bench_attention"), "bm_sdpa/", threads)
    pt = torch_attention(threads)
    return {f"T={t} {'causal' if c else 'full'} {'bf16' if b else 'fp32'}":
            (tk[f"bm_sdpa/{t}/{c}/{b}"] * 1e3, pt[(t, c, b)] * 1e3, tk[f"bm_sdpa/{t}/{c}/{b}"] / pt[(t, c, b)])
            for (t, c, b) in sorted(pt)}


def print_rounds(rounds):
    """Rows of (trainkit ms, pytorch ms, ratio) per key: median (min-max) over the rounds."""
    print(f"{'':<22}{'trainkit ms':>25}{'pytorch ms':>25}{'tk/pt':>25}")
    for key in rounds[0]:
        cells = []
        for i in range(3):
            v = sorted(r[key][i] for r in rounds)
            med = v[len(v) // 2]
            cells.append(f"{med:.2f} ({v[0]:.2f}-{v[-1]:.2f})" if len(v) > 1 else f"{med:.2f}")
        print(f"{key:<22}" + "".join(f"{c:>25}" for c in cells))


def print_attention(rounds, threads):
    print(f"threads: {threads}  rounds: {len(rounds)}; scaled_dot_product_attention forward + backward "
          f"(fp32; bf16: trainkit under amp::autocast<mixed_bf16>, torch on bf16 tensors), "
          f"[4, 8, T, 64]; median (min-max) over the rounds")
    print_rounds(rounds)


def gpt_round(build, steps):
    """Median step ms of examples/gpt_char and benchmarks/gpt_char_pytorch.py (same model and
    data), fp32 and bf16, run one after the other."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = {}
    for prec in ("fp32", "bf16"):
        common = ["--steps", str(steps), "--eval-every", str(steps), "--precision", prec]
        ms = []
        for cmd in ([os.path.join(build, "examples", "gpt_char"), "--sample-chars", "0"] + common,
                    [sys.executable, os.path.join(here, "gpt_char_pytorch.py")] + common):
            text = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            ms.append(float(re.search(r"median step ([0-9.]+) ms", text).group(1)))
        out[f"gpt {prec}"] = (ms[0], ms[1], ms[0] / ms[1])
    return out


def cpu_line():
    """The CPU's model and the flags the kernels choose by, as the C++ benchmarks print them."""
    model, flags = "unknown", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    have = set(line.split(":", 1)[1].split())
                    flags = [x for x in ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_bf16", "avx_ne_convert")
                             if x in have]
    except OSError:
        pass
    limit = os.environ.get("TRAINKIT_MAX_CPU_ISA") or os.environ.get("ONEDNN_MAX_CPU_ISA")
    return f"CPU: {model}; flags: {' '.join(flags)}" + (f"; limited by {limit}" if limit else "")


# An AVX-512 machine made to run an AVX2-only machine's kernels, every library alike: trainkit's own
# (TRAINKIT_MAX_CPU_ISA), oneDNN's, PyTorch's ATen, and the two BLAS that choose by themselves
# (OpenBLAS's sgemm for trainkit, MKL's for PyTorch). Without the last two both sides keep their
# AVX-512 GEMMs, and the figures are not an AVX2 machine's.
AVX2_ENVIRONMENT = {"TRAINKIT_MAX_CPU_ISA": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
                    "OPENBLAS_CORETYPE": "Haswell", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--emulate-avx2", action="store_true",
                    help="run every library's AVX2 kernels (trainkit, oneDNN, ATen, OpenBLAS, MKL) on an AVX-512 CPU")
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", action="store_true", help="fp32/bf16/fp16 train_step rows against autocast")
    ap.add_argument("--attention", action="store_true", help="scaled_dot_product_attention against torch's")
    ap.add_argument("--gpt", action="store_true", help="the GPT example's training step against PyTorch's")
    ap.add_argument("--gpt-steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    if a.emulate_avx2:  # before torch is imported and before any benchmark starts
        os.environ.update(AVX2_ENVIRONMENT)
    print(cpu_line())
    blas = [f"{k}={os.environ[k]}" for k in ("OPENBLAS_CORETYPE", "MKL_ENABLE_INSTRUCTIONS") if k in os.environ]
    if blas:
        print("BLAS kernels limited: " + " ".join(blas))
    try:
        import torch
        print(f"PyTorch {torch.__version__}, ATen CPU capability {torch.backends.cpu.get_cpu_capability()}")
    except (ImportError, AttributeError):
        pass
    bench = os.path.join(a.build, "benchmarks")
    if a.gpt:
        rounds = [gpt_round(a.build, a.gpt_steps) for _ in range(a.rounds)]
        print(f"examples/gpt_char (4 layers, 128 wide, context 64, batch 32) against gpt_char_pytorch.py: "
              f"median step over {a.gpt_steps} steps; median (min-max) over {len(rounds)} rounds")
        print_rounds(rounds)
        return 0
    if a.attention:
        print_attention([attention_round(bench, a.threads) for _ in range(a.rounds)], a.threads)
        return 0
    if a.precision:
        rounds = [precision_round(bench, a.threads) for _ in range(a.rounds)]
        print_precision(rounds, a.threads)
        return 0
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
