#!/usr/bin/env python3
"""The work of bench_cuda_bandwidth and bench_cuda_train_step, timed in PyTorch eager on the GPU.

    python3 benchmarks/compare_pytorch_cuda.py [--steps 50] [--warmup 10] [--iters 20] [--mib 256]
    python3 benchmarks/compare_pytorch_cuda.py --compare trainkit.jsonl pytorch.jsonl   # ratios

Prints one JSON object per line with the keys the trainkit benchmarks print ("bench", "ms", ...,
"framework": "pytorch"), so that --compare can pair them: a training step passes when trainkit's
time is at most 1.0x PyTorch's; an elementwise or reduction kernel when it reaches 80 % of the
peak bandwidth given by --peak-gbps (4800 GB/s, the H200's).

The models match benchmarks/cuda_train_step.cu: the 4 x Linear(4096, 4096) MLP (batch 1024, 4096
classes) under torch.autocast(bfloat16) with fp32 weights, and held in bfloat16; the Fashion-MNIST
CNN (batch 128) in strict fp32 and with TF32, and in strict fp32 under PyTorch's
DistributedDataParallel in a one-process NCCL group (cnn_fp32_ddp1, against trainkit's
data_parallel at world size 1); the GPT of examples/gpt_char (benchmarks/gpt_char_pytorch.py's
model, beside this script) at 6 layers, width 384, 6 heads, context 256, batch 64, 96 symbols, with
AdamW (decay on the matrices), clipping at 1.0, under torch.autocast(bfloat16) and in strict fp32.
SGD with momentum 0.9 for the others (PyTorch's default foreach implementations), no loss read per
step, CUDA events around the timed steps.
"""
import argparse
import json
import os
import sys


def time_ms(fn, warmup, iters):
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / iters


def emit(obj):
    obj["framework"] = "pytorch"
    print(json.dumps(obj), flush=True)


def bandwidth(args):
    import torch

    n = int(args.mib * (1 << 20) // 4)
    nbytes = n * 4
    a = torch.full((n,), 1.5, device="cuda")
    b = torch.full((n,), 0.25, device="cuda")
    out = torch.empty(n, device="cuda")
    a2 = a.view(-1, 4096)
    box = {}

    def set_out(v):
        box["out"] = v

    cases = [
        ("cudaMemcpy_d2d", 2 * nbytes, lambda: out.copy_(a)),
        ("copy_", 2 * nbytes, lambda: out.copy_(a)),
        ("fill_", nbytes, lambda: out.fill_(3.0)),
        ("mul_scalar_inplace", 2 * nbytes, lambda: out.mul_(1.0001)),
        ("add(a,b)", 3 * nbytes, lambda: set_out(a + b)),
        ("exp(a)", 2 * nbytes, lambda: set_out(torch.exp(a))),
        ("gelu(a)", 2 * nbytes, lambda: set_out(torch.nn.functional.gelu(a))),
        ("add_(out,a,alpha)", 3 * nbytes, lambda: out.add_(a, alpha=0.5)),
        ("cast_bf16", int(1.5 * nbytes), lambda: set_out(a.to(torch.bfloat16))),
        ("sum_all", nbytes, lambda: set_out(a.sum())),
        ("amax_all", nbytes, lambda: set_out(a.amax())),
        ("sum_rows[.,4096]", nbytes, lambda: set_out(a2.sum(1))),
        ("sum_cols[.,4096]", nbytes, lambda: set_out(a2.sum(0))),
        ("argmax_rows[.,4096]", nbytes, lambda: set_out(a2.argmax(1))),
    ]
    for name, nb, fn in cases:
        ms = time_ms(fn, 3, args.iters)
        gbps = nb / (ms * 1e-3) / 1e9
        emit({"bench": name, "mib": args.mib, "ms": round(ms, 4), "gbps": round(gbps, 1),
              "of_peak": round(gbps / args.peak_gbps, 3)})


def train_steps(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    def mlp(dtype=torch.float32):
        torch.manual_seed(1)
        layers = []
        for i in range(4):
            layers.append(nn.Linear(4096, 4096))
            if i < 3:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers).cuda().to(dtype)

    def cnn():
        torch.manual_seed(1)
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10)).cuda()

    def labels(n, classes):
        return (torch.arange(n, device="cuda") * 7919) % classes

    def run(name, model, x, y, autocast_dtype=None):
        if args.only and args.only != name:
            return
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        def step():
            if autocast_dtype is not None:
                with torch.autocast("cuda", dtype=autocast_dtype):
                    logits = model(x)
                loss = F.cross_entropy(logits.float(), y)
            else:
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        torch.cuda.reset_peak_memory_stats()
        ms = time_ms(step, args.warmup, args.steps)
        emit({"bench": name, "batch": x.shape[0], "ms": round(ms, 4),
              "samples_per_s": round(x.shape[0] / (ms * 1e-3), 1),
              "peak_mib": round(torch.cuda.max_memory_allocated() / (1 << 20), 1)})

    x = torch.randn(1024, 4096, device="cuda")
    y = labels(1024, 4096)
    run("mlp_bf16_amp", mlp(), x, y, autocast_dtype=torch.bfloat16)
    run("mlp_bf16", mlp(torch.bfloat16), x.to(torch.bfloat16), y)
    torch.backends.cuda.matmul.allow_tf32 = False
    run("mlp_fp32", mlp(), x, y)
    for tf32, name in ((False, "cnn_fp32"), (True, "cnn_tf32")):
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        xc = torch.randn(128, 1, 28, 28, device="cuda")
        run(name, cnn(), xc, labels(128, 10))
    # PyTorch's DDP at world size 1 (a one-process NCCL group), the counterpart of trainkit's
    # cnn_fp32_ddp1: strict fp32, the same CNN and batch.
    if not args.only or args.only == "cnn_fp32_ddp1":
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            import tempfile
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP
            store = os.path.join(tempfile.mkdtemp(prefix="tk_ddp1_"), "store")
            dist.init_process_group("nccl", init_method="file://" + store, rank=0, world_size=1)
        except Exception as e:  # no NCCL in this PyTorch build: the row is left out, visibly
            print(f"compare_pytorch_cuda: no PyTorch DDP row ({e})", file=sys.stderr)
        else:
            try:
                xc = torch.randn(128, 1, 28, 28, device="cuda")
                run("cnn_fp32_ddp1", DDP(cnn(), device_ids=[torch.cuda.current_device()]), xc, labels(128, 10))
            finally:
                dist.destroy_process_group()
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cuda.matmul.allow_tf32 = False
    gpt_steps(args)


def gpt_steps(args):
    """The GPT rows of bench_cuda_train_step (gpt_bf16_amp, gpt_fp32)."""
    import types
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpt_char_pytorch import GPT

    c = types.SimpleNamespace(vocab=96, context=256, layers=6, embd=384, heads=6, dropout=0.0)
    batch = 64
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, bf16 in (("gpt_bf16_amp", True), ("gpt_fp32", False)):
        if args.only and args.only != name:
            continue
        torch.manual_seed(1)
        model = GPT(c).cuda()
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.99))
        x = (torch.arange(batch * c.context, device="cuda") * 7919 % c.vocab).reshape(batch, c.context)
        y = (torch.arange(1, batch * c.context + 1, device="cuda") * 7919 % c.vocab)

        def step():
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                logits = model(x)
            loss = F.cross_entropy(logits.float().reshape(-1, c.vocab), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

        torch.cuda.reset_peak_memory_stats()
        ms = time_ms(step, args.warmup, args.steps)
        emit({"bench": name, "batch": batch, "ms": round(ms, 4), "samples_per_s": round(batch / (ms * 1e-3), 1),
              "peak_mib": round(torch.cuda.max_memory_allocated() / (1 << 20), 1)})


def kernel_counts(args):
    """Kernels per Linear(1024, 1024) forward + backward (bench_cuda_kernel_count's rows): a stack of
    3 layers minus a stack of 2, each after two warm-up runs, counted by torch.profiler."""
    import torch
    import torch.nn as nn
    from torch.profiler import ProfilerActivity, profile

    def stack_kernels(layers, dtype):
        torch.manual_seed(1)
        stack = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(layers)]).cuda()
        x = torch.randn(256, 1024, device="cuda")

        def run():
            stack.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
                h = stack(x)
            h.backward(torch.ones_like(h))

        run()
        run()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                   and not e.name.startswith(("Memcpy", "Memset")))

    for name, dtype in (("linear_bf16_kernels", torch.bfloat16), ("linear_fp32_kernels", None)):
        if args.only and args.only != name:
            continue
        three, two = stack_kernels(3, dtype), stack_kernels(2, dtype)
        emit({"bench": name, "kernels": three - two, "stack3": three, "stack2": two})


def attention(args):
    """torch.nn.functional.scaled_dot_product_attention forward + backward, causal [4, 16, T, 64]:
    the rows of bench_cuda_attention (bf16 under autocast; fp32 with TF32 off)."""
    import torch
    import torch.nn.functional as F

    torch.backends.cuda.matmul.allow_tf32 = False
    for name, t, bf16 in (("attention_bf16_t1024", 1024, True), ("attention_bf16_t4096", 4096, True),
                          ("attention_fp32_t1024", 1024, False)):
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v, dout = (torch.randn(4, 16, t, 64, device="cuda", generator=g) for _ in range(4))
        for x in (q, k, v):
            x.requires_grad_(True)

        def step():
            for x in (q, k, v):
                x.grad = None
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.backward(dout.to(out.dtype))

        ms = time_ms(step, args.warmup, args.iters)
        flops = 4.0 * 16 * t * t * 64 * 2 * 3.5 / 2
        emit({"bench": name, "ms": round(ms, 4), "tflops": round(flops / (ms * 1e-3) / 1e12, 1)})


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                obj = json.loads(line)
                rows[obj["bench"]] = obj
    return rows


def compare(args):
    tk, pt = load(args.compare[0]), load(args.compare[1])
    ok = True
    lines = ["| bench | trainkit | pytorch | ratio | target | |", "|---|---|---|---|---|---|"]
    # Targets within trainkit's own rows: bf16 at least 2x strict fp32 on the MLP, DDP at world size 1
    # at most 3 % over the plain step.
    own = {"mlp_bf16_amp": ("mlp_fp32", 0.5, "<= 0.5x mlp_fp32"), "cnn_fp32_ddp1": ("cnn_fp32", 1.03, "<= 1.03x cnn_fp32")}
    for name, r in tk.items():
        p = pt.get(name)
        if name in own and own[name][0] in tk:
            base, limit, text = own[name]
            ratio = r["ms"] / tk[base]["ms"]
            passed = ratio <= limit
            lines.append(f"| {name} vs {base} | {r['ms']:.3f} ms | {tk[base]['ms']:.3f} ms (trainkit) | {ratio:.2f}x | "
                         f"{text} | {'ok' if passed else 'MISSED'} |")
            ok = ok and passed
            if p is None:
                continue
        if "kernels" in r:
            # At most PyTorch's for bf16 (the issue's target); fp32's count is reported only.
            target = name == "linear_bf16_kernels"
            passed = (p is not None and r["kernels"] <= p["kernels"]) or not target
            ref = str(p["kernels"]) if p else "-"
            lines.append(f"| {name} | {r['kernels']} kernels | {ref} | - | {'<= pytorch' if target else '-'} | "
                         f"{'ok' if passed else 'MORE'} |")
        elif "gbps" in r:
            passed = r["gbps"] >= 0.8 * args.peak_gbps or name == "cudaMemcpy_d2d"
            ref = f"{p['gbps']:.0f} GB/s" if p else "-"
            lines.append(f"| {name} | {r['gbps']:.0f} GB/s ({100 * r['gbps'] / args.peak_gbps:.0f} %) | {ref} | "
                         f"{(r['gbps'] / p['gbps']) if p else float('nan'):.2f}x | >= 80 % of {args.peak_gbps:.0f} | "
                         f"{'ok' if passed else 'BELOW'} |")
        else:
            ratio = r["ms"] / p["ms"] if p else float("nan")
            ref = f"{p['ms']:.3f} ms" if p else "-"
            # Attention in bf16: at most 1.1x PyTorch's fused attention (issue 29); fp32 is reported only.
            limit = 1.1 if name.startswith("attention_bf16") else None if name.startswith("attention_") else 1.0
            passed = limit is None or (p is not None and ratio <= limit)
            target = f"<= {limit}x" if limit else "-"
            lines.append(f"| {name} | {r['ms']:.3f} ms | {ref} | {ratio:.2f}x | {target} | {'ok' if passed else 'SLOWER'} |")
        ok = ok and passed
    print("\n".join(lines))
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--mib", type=float, default=256)
    ap.add_argument("--peak-gbps", type=float, default=4800)
    ap.add_argument("--only", default=None, help="one training-step benchmark by name")
    ap.add_argument("--skip-bandwidth", action="store_true")
    ap.add_argument("--skip-steps", action="store_true")
    ap.add_argument("--compare", nargs=2, metavar=("TRAINKIT_JSONL", "PYTORCH_JSONL"))
    args = ap.parse_args()
    if args.compare:
        return compare(args)
    try:
        import torch
    except ImportError:
        print("SKIPPED: PyTorch is not installed", file=sys.stderr)
        return 77
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device for PyTorch", file=sys.stderr)
        return 77
    if not args.skip_bandwidth:
        bandwidth(args)
    if not args.skip_steps:
        train_steps(args)
    kernel_counts(args)
    attention(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
