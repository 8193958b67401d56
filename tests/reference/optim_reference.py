#!/usr/bin/env python3
"""Reference numbers for tests/optim and tests/nn, computed with PyTorch.

    python3 tests/reference/optim_reference.py [section]

prints C++ initialiser lists that are pasted into the tests (sections: sgd, adam, adamw, sched,
clip, bn; all by default). Everything runs in float64 so the C++ double tests can compare to
~1e-12; the float tests compare the same numbers with a float tolerance.

The problem every optimizer case runs (the C++ tests build the same one):
  p0 [2, 3] = -0.25 + 0.1 * i        p1 [4] = 1.0 - 0.3 * i
  p2 [3]    = {0.5, -0.5, 2.0}       never has a gradient: must not move, must get no state
  p3 [2]    = {-1.0, 3.0}            no gradient at step 2: skipped that step
  5 steps; at step k the gradient of element i of parameter j is
  g = 0.5 * p + cos(0.3 * i + 0.7 * k + j), computed from the current p in float64.
  Cases with lr_change set the learning rate to new_lr before step lr_change_step.
"""
import math
import sys

import torch

torch.set_default_dtype(torch.float64)
STEPS = 5


def fmt(v):
    return repr(float(v))  # shortest text that round-trips


def arr(t):
    return "{" + ", ".join(fmt(x) for x in t.reshape(-1).tolist()) + "}"


def make_params():
    p0 = torch.tensor([-0.25 + 0.1 * i for i in range(6)]).reshape(2, 3)
    p1 = torch.tensor([1.0 - 0.3 * i for i in range(4)])
    p2 = torch.tensor([0.5, -0.5, 2.0])
    p3 = torch.tensor([-1.0, 3.0])
    return [p.clone().requires_grad_(True) for p in (p0, p1, p2, p3)]


def set_grads(params, k):
    for j, p in enumerate(params):
        p.grad = None
        if j == 2 or (j == 3 and k == 2):
            continue
        i = torch.arange(p.numel(), dtype=torch.float64).reshape(p.shape)
        p.grad = (0.5 * p.detach() + torch.cos(0.3 * i + 0.7 * k + j)).to(p.dtype)


def run(make_opt, lr_change=None):
    params = make_params()
    opt = make_opt(params)
    for k in range(STEPS):
        if lr_change is not None and k == lr_change[0]:
            for g in opt.param_groups:
                g["lr"] = lr_change[1]
        set_grads(params, k)
        opt.step()
    return params, opt


def cxx_opts(kw):
    parts = []
    for k, v in kw.items():
        if k == "betas":
            parts.append(".beta1 = %s" % fmt(v[0]))
            parts.append(".beta2 = %s" % fmt(v[1]))
        elif isinstance(v, bool):
            parts.append(".%s = %s" % (k, "true" if v else "false"))
        else:
            parts.append(".%s = %s" % (k, fmt(v)))
    # designated initialisers must follow declaration order
    order = ["lr", "momentum", "dampening", "beta1", "beta2", "eps", "weight_decay", "nesterov", "amsgrad", "maximize"]
    parts.sort(key=lambda s: order.index(s[1:].split(" ")[0]))
    return "{" + ", ".join(parts) + "}"


SGD_CASES = [
    ("plain", dict(lr=0.1), None),
    ("momentum", dict(lr=0.1, momentum=0.9), None),
    ("dampening", dict(lr=0.1, momentum=0.9, dampening=0.3), None),
    ("nesterov", dict(lr=0.1, momentum=0.9, nesterov=True), None),
    ("momentum_wd", dict(lr=0.1, momentum=0.9, weight_decay=0.05), None),
    ("plain_wd", dict(lr=0.05, weight_decay=0.1), None),
    ("maximize_nesterov_wd", dict(lr=0.1, momentum=0.5, weight_decay=0.1, nesterov=True, maximize=True), None),
    ("lr_change", dict(lr=0.1, momentum=0.9), (3, 0.02)),
]
ADAM_CASES = [
    ("default_lr", dict(lr=0.01), None),
    ("l2", dict(lr=0.01, weight_decay=0.1), None),
    ("amsgrad", dict(lr=0.01, amsgrad=True), None),
    ("amsgrad_l2", dict(lr=0.01, weight_decay=0.05, amsgrad=True), None),
    ("betas_eps", dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6), None),
    ("maximize_l2", dict(lr=0.01, weight_decay=0.1, maximize=True), None),
    ("lr_change", dict(lr=0.01), (3, 0.003)),
]
ADAMW_CASES = [
    ("default_wd", dict(lr=0.01), None),
    ("wd", dict(lr=0.01, weight_decay=0.1), None),
    ("wd_amsgrad", dict(lr=0.01, weight_decay=0.1, amsgrad=True), None),
    ("maximize_betas", dict(lr=0.005, betas=(0.85, 0.95), weight_decay=0.2, maximize=True), None),
    ("no_wd", dict(lr=0.01, weight_decay=0.0), None),
]


def section_sgd():
    print("// sgd: name, options, lr_change_step (-1: none), new_lr, p0, p1, p3, momentum_buffer of p0, of p3")
    for name, kw, ch in SGD_CASES:
        params, opt = run(lambda ps: torch.optim.SGD(ps, foreach=False, **kw), ch)
        st = opt.state
        buf0 = st[params[0]]["momentum_buffer"] if kw.get("momentum", 0) else torch.zeros(0)
        buf3 = st[params[3]]["momentum_buffer"] if kw.get("momentum", 0) else torch.zeros(0)
        assert params[2] not in st or st[params[2]].get("momentum_buffer") is None
        print('{"%s", %s, %d, %s,\n %s,\n %s,\n %s,\n %s,\n %s},' % (
            name, cxx_opts(kw), ch[0] if ch else -1, fmt(ch[1]) if ch else "0.0",
            arr(params[0].detach()), arr(params[1].detach()), arr(params[3].detach()), arr(buf0), arr(buf3)))


def section_adam(cls, cases, label):
    print("// %s: name, options, lr_change_step, new_lr, p0, p1, p3, exp_avg, exp_avg_sq, max_exp_avg_sq of p0,"
          " exp_avg_sq of p3, step of p3" % label)
    for name, kw, ch in cases:
        params, opt = run(lambda ps: cls(ps, foreach=False, **kw), ch)
        s0 = opt.state[params[0]]
        s3 = opt.state[params[3]]
        assert params[2] not in opt.state
        mx = s0["max_exp_avg_sq"] if kw.get("amsgrad") else torch.zeros(0)
        print('{"%s", %s, %d, %s,\n %s,\n %s,\n %s,\n %s,\n %s,\n %s,\n %s, %d},' % (
            name, cxx_opts(kw), ch[0] if ch else -1, fmt(ch[1]) if ch else "0.0",
            arr(params[0].detach()), arr(params[1].detach()), arr(params[3].detach()),
            arr(s0["exp_avg"]), arr(s0["exp_avg_sq"]), arr(mx), arr(s3["exp_avg_sq"]), int(s3["step"].item())))


def lr_sequence(sched_factory, base_lr, n):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base_lr)
    sched = sched_factory(opt)
    lrs = []
    for _ in range(n):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def section_sched():
    import warnings
    warnings.filterwarnings("ignore")
    from torch.optim import lr_scheduler as L
    print("// StepLR(step_size=3, gamma=0.5), base 0.1, 20 steps")
    print(arr(torch.tensor(lr_sequence(lambda o: L.StepLR(o, step_size=3, gamma=0.5), 0.1, 20))) + ";")
    print("// CosineAnnealingLR(T_max=20, eta_min=0.001), base 0.1, steps 0..20")
    print(arr(torch.tensor(lr_sequence(lambda o: L.CosineAnnealingLR(o, T_max=20, eta_min=0.001), 0.1, 21))) + ";")
    W, T, base, mn = 5, 20, 0.1, 0.001

    def lam(k):  # transformers' get_cosine_with_min_lr_schedule_with_warmup, held at the floor after T
        if k < W:
            return k / W
        if k >= T:
            return mn / base
        p = (k - W) / (T - W)
        return (mn + (base - mn) * 0.5 * (1 + math.cos(math.pi * p))) / base

    print("// LambdaLR(linear warmup 5, cosine to 0.001 at 20), base 0.1, 25 steps")
    print(arr(torch.tensor(lr_sequence(lambda o: L.LambdaLR(o, lam), base, 25))) + ";")
    for mode, kw in [("triangular", dict(step_size_up=4)),
                     ("triangular2", dict(step_size_up=3, step_size_down=5)),
                     ("exp_range", dict(step_size_up=4, step_size_down=2, gamma=0.9))]:
        print("// CyclicLR(base 0.001, max 0.1, mode %s, %s), 30 steps" % (mode, kw))
        seq = lr_sequence(lambda o: L.CyclicLR(o, base_lr=0.001, max_lr=0.1, mode=mode, cycle_momentum=False, **kw),
                          0.5, 30)
        print(arr(torch.tensor(seq)) + ";")


def clip_grads():
    g0 = torch.tensor([0.5, -1.5, 2.0, 0.25, -0.75, 1.0]).reshape(2, 3)
    g1 = torch.tensor([3.0, -0.5, 0.125, -2.5])
    g2 = torch.tensor([-4.0])
    return [g0, g1, g2]


def section_clip():
    print("// clip_grad_norm_ on g0 [2,3], g1 [4], g2 [1] (plus a parameter without a gradient):")
    print("// norm_type, max_norm, total norm, clipped gradients concatenated")
    for norm_type in [2.0, 1.0, float("inf"), 3.0, 0.5]:
        for max_norm in [1.0, 100.0]:
            ps = [torch.zeros_like(g, requires_grad=True) for g in clip_grads()]
            for p, g in zip(ps, clip_grads()):
                p.grad = g.clone()
            extra = torch.zeros(2, requires_grad=True)
            total = torch.nn.utils.clip_grad_norm_(ps + [extra], max_norm, norm_type=norm_type)
            nt = "optim::inf_norm" if math.isinf(norm_type) else fmt(norm_type)
            print("{%s, %s, %s, %s}," % (nt, fmt(max_norm), fmt(total.item()),
                                         arr(torch.cat([p.grad.reshape(-1) for p in ps]))))


def section_bn():
    print("// BatchNorm2d(3): x [2,3,2,2] = sin(0.7 i); train forward x, then 2x+1; running stats; eval forward of x")
    x = torch.sin(0.7 * torch.arange(24.0)).reshape(2, 3, 2, 2)
    for momentum in [0.1, None]:
        bn = torch.nn.BatchNorm2d(3, momentum=momentum)
        bn.train()
        y1 = bn(x)
        bn(2 * x + 1)
        rm, rv = bn.running_mean.clone(), bn.running_var.clone()
        bn.eval()
        y2 = bn(x)
        print("// momentum = %s: y_train(x), running_mean, running_var, num_batches_tracked, y_eval(x)" % momentum)
        print("%s,\n%s,\n%s, %d,\n%s," % (arr(y1.detach()), arr(rm), arr(rv), bn.num_batches_tracked.item(),
                                          arr(y2.detach())))


if __name__ == "__main__":
    which = sys.argv[1:] or ["sgd", "adam", "adamw", "sched", "clip", "bn"]
    for s in which:
        if s == "sgd":
            section_sgd()
        elif s == "adam":
            section_adam(torch.optim.Adam, ADAM_CASES, "adam")
        elif s == "adamw":
            section_adam(torch.optim.AdamW, ADAMW_CASES, "adamw")
        elif s == "sched":
            section_sched()
        elif s == "clip":
            section_clip()
        elif s == "bn":
            section_bn()
        else:
            sys.exit("unknown section " + s)
