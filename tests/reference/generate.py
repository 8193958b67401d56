#!/usr/bin/env python3
"""Writes the PyTorch reference files the C++ suite compares against (llm.c style).

Each file is text, one tensor per line:  <name> <ndim> <dims...> <values...>
Values are printed with 9 significant digits, which round-trips float32 exactly; integer
tensors (targets, indices) are stored as their float values. Regenerate with
    pip install torch && python3 tests/reference/generate.py
The suite never needs torch: it reads the committed files.
"""
import os

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
torch.manual_seed(1234)
torch.set_default_dtype(torch.float32)


class Writer:
    def __init__(self, path):
        self.f = open(path, "w")
        self.f.write(f"# trainkit reference, torch {torch.__version__}\n")

    def put(self, name, t):
        t = t.detach().to(torch.float32).contiguous()
        dims = " ".join(str(d) for d in t.shape)
        vals = " ".join(f"{v:.9g}" for v in t.flatten().tolist())
        self.f.write(f"{name} {t.dim()} {dims} {vals}\n".replace("  ", " "))

    def close(self):
        self.f.close()


def rnd(*shape, positive=False):
    t = torch.randn(*shape)
    return t.abs() + 0.5 if positive else t


def op_case(w, name, fn, inputs, extra=None):
    """Forward fn(*inputs); backward of sum(out * R) with a fixed random R."""
    xs = [x.clone().requires_grad_(True) for x in inputs]
    out = fn(*xs)
    r = torch.randn_like(out)
    (out * r).sum().backward()
    for i, x in enumerate(inputs):
        w.put(f"{name}.in{i}", x)
    w.put(f"{name}.out", out)
    w.put(f"{name}.r", r)
    for i, x in enumerate(xs):
        w.put(f"{name}.grad{i}", x.grad)
    for k, v in (extra or {}).items():
        w.put(f"{name}.{k}", v)


def ops_file():
    w = Writer(os.path.join(HERE, "ops.txt"))
    op_case(w, "add", lambda a, b: a + b, [rnd(3, 4), rnd(4)])
    op_case(w, "mul", lambda a, b: a * b, [rnd(2, 3, 4), rnd(3, 1)])
    op_case(w, "div", lambda a, b: a / b, [rnd(3, 4), rnd(3, 4, positive=True)])
    op_case(w, "exp", torch.exp, [rnd(5)])
    op_case(w, "log", torch.log, [rnd(5, positive=True)])
    op_case(w, "sqrt", torch.sqrt, [rnd(5, positive=True)])
    op_case(w, "pow", lambda a: a.pow(3.0), [rnd(6)])
    op_case(w, "tanh", torch.tanh, [rnd(6)])
    op_case(w, "sigmoid", torch.sigmoid, [rnd(6)])
    op_case(w, "relu", torch.relu, [rnd(6)])
    op_case(w, "gelu", F.gelu, [rnd(6)])
    op_case(w, "matmul", torch.matmul, [rnd(2, 1, 3, 4), rnd(3, 4, 5)])
    op_case(w, "sum", lambda a: a.sum(dim=1), [rnd(3, 4, 2)])
    op_case(w, "mean", lambda a: a.mean(dim=(0, 2), keepdim=True), [rnd(3, 4, 2)])
    op_case(w, "softmax", lambda a: torch.softmax(a, dim=1), [rnd(4, 7)])
    op_case(w, "log_softmax", lambda a: torch.log_softmax(a, dim=1), [rnd(4, 7)])
    op_case(w, "linear", F.linear, [rnd(5, 6), rnd(3, 6), rnd(3)])
    op_case(w, "conv2d", lambda x, k, b: F.conv2d(x, k, b, stride=2, padding=1, dilation=1, groups=2),
            [rnd(2, 4, 7, 6), rnd(6, 2, 3, 3), rnd(6)])
    op_case(w, "conv2d_dilated", lambda x, k: F.conv2d(x, k, None, stride=1, padding=2, dilation=2),
            [rnd(1, 3, 6, 6), rnd(2, 3, 3, 3)])
    op_case(w, "max_pool2d", lambda x: F.max_pool2d(x, 2, 2), [rnd(2, 3, 6, 6)])
    op_case(w, "max_pool2d_s1p1", lambda x: F.max_pool2d(x, 3, 1, 1), [rnd(1, 2, 5, 5)])
    op_case(w, "avg_pool2d", lambda x: F.avg_pool2d(x, 3, 2, 1), [rnd(2, 3, 7, 7)])
    op_case(w, "layer_norm", lambda x, g, b: F.layer_norm(x, (6,), g, b, 1e-5), [rnd(4, 6), rnd(6), rnd(6)])
    op_case(w, "mse_loss", lambda a, b: F.mse_loss(a, b), [rnd(4, 3), rnd(4, 3)])
    # batch_norm in training mode: outputs, grads and the updated running statistics.
    x, g, b = rnd(4, 3, 5, 5), rnd(3), rnd(3)
    rm, rv = torch.randn(3) * 0.1, torch.rand(3) + 0.5
    rm0, rv0 = rm.clone(), rv.clone()
    op_case(w, "batch_norm", lambda x, g, b: F.batch_norm(x, rm, rv, g, b, True, 0.1, 1e-5), [x, g, b],
            {"running_mean_in": rm0, "running_var_in": rv0})
    w.put("batch_norm.running_mean_out", rm)
    w.put("batch_norm.running_var_out", rv)
    # cross entropy with label smoothing and with ignore_index
    logits, target = rnd(6, 5), torch.tensor([0, 4, 2, 2, 1, 3])
    op_case(w, "cross_entropy", lambda a: F.cross_entropy(a, target, label_smoothing=0.1), [logits],
            {"target": target})
    target2 = torch.tensor([0, -100, 2, 2, -100, 3])
    op_case(w, "cross_entropy_ignore", lambda a: F.cross_entropy(a, target2, ignore_index=-100), [logits],
            {"target": target2})
    idx = torch.tensor([[1, 3, 1], [0, 4, 2]])
    op_case(w, "embedding", lambda wt: F.embedding(idx, wt), [rnd(5, 4)], {"indices": idx})
    w.close()


def train_file(path, model, make_batch, optimizers, steps=3):
    """Initial parameters, then for each optimizer: per-step loss and final parameters."""
    w = Writer(path)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    for k, v in init.items():
        w.put(f"init.{k}", v)
    xs, ys = [], []
    for s in range(steps):
        x, y = make_batch()
        xs.append(x)
        ys.append(y)
        w.put(f"batch{s}.x", x)
        w.put(f"batch{s}.y", y)
    for tag, make_opt in optimizers:
        model.load_state_dict(init)
        model.train()
        opt = make_opt(model.parameters())
        losses = []
        for s in range(steps):
            opt.zero_grad()
            loss = F.cross_entropy(model(xs[s]), ys[s])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        w.put(f"{tag}.losses", torch.tensor(losses))
        for k, v in model.state_dict().items():
            w.put(f"{tag}.final.{k}", v)
    w.close()


class ResidualNet(torch.nn.Module):
    """conv 3x3 (1->4) - relu - [conv 3x3, relu, conv 3x3] + skip - relu - flatten - linear (64->5)."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.c1 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.c2 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.head = torch.nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(h + self.c2(torch.relu(self.c1(h))))  # the residual connection
        return self.head(torch.flatten(h, 1))


def residual_bf16_file(path):
    """A residual network under torch.autocast("cpu", dtype=torch.bfloat16): the fp32 master
    parameters, one batch, and the logits, cross-entropy loss and parameter gradients of one
    forward/backward - plus the plain fp32 logits and loss (the same model without autocast).

    Under CPU autocast every conv2d and linear casts its input, weight and bias to bf16 and returns
    bf16 (fp32 accumulation, the bias added before the one rounding of the result); relu and the
    residual add run on those bf16 tensors; the loss is computed in fp32 on the logits. The .grad of
    each fp32 parameter is the bf16 gradient of its bf16 copy, widened back to fp32."""
    torch.manual_seed(4321)  # independent of the files written before this one
    model = ResidualNet()
    w = Writer(path)
    for k, v in model.state_dict().items():
        w.put(f"init.{k}", v)
    x, y = torch.randn(4, 1, 4, 4), torch.randint(0, 5, (4,))
    w.put("x", x)
    w.put("y", y)
    with torch.no_grad():
        out32 = model(x)
    w.put("fp32.out", out32)
    w.put("fp32.loss", F.cross_entropy(out32, y).reshape(1))
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
        assert out.dtype == torch.bfloat16
        loss = F.cross_entropy(out.float(), y)  # fp32, as autocast runs losses
    loss.backward()
    w.put("bf16.out", out)
    w.put("bf16.loss", loss.reshape(1))
    for k, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32
        w.put(f"bf16.grad.{k}", p.grad)
    w.close()


def attention_file(path):
    """scaled_dot_product_attention (plain, causal, additive mask with a scale, boolean mask) and
    nn.MultiheadAttention (self-attention batch_first with key padding and a causal mask; cross-
    attention in [L, N, E] with a float mask), dropout off: outputs and the gradients of
    sum(out * R), parameters included."""
    torch.manual_seed(2929)  # independent of the files written before this one
    w = Writer(path)
    op_case(w, "sdpa", F.scaled_dot_product_attention, [rnd(2, 2, 5, 4), rnd(2, 2, 7, 4), rnd(2, 2, 7, 3)])
    op_case(w, "sdpa_causal", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            [rnd(1, 2, 6, 4), rnd(1, 2, 6, 4), rnd(1, 2, 6, 4)])
    mask = rnd(5, 7)
    op_case(w, "sdpa_mask", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.5),
            [rnd(2, 2, 5, 4), rnd(2, 2, 7, 4), rnd(2, 2, 7, 3)], {"mask": mask})
    bmask = torch.rand(2, 1, 5, 7) < 0.6
    bmask[..., 0] = True  # every query sees a key
    op_case(w, "sdpa_bool", lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=bmask),
            [rnd(2, 2, 5, 4), rnd(2, 2, 7, 4), rnd(2, 2, 7, 3)], {"mask": bmask})

    def mha_case(name, mha, inputs, **kw):
        for k, v in mha.state_dict().items():
            w.put(f"{name}.{k}", v)
        xs = [x.clone().requires_grad_(True) for x in inputs]
        out, _ = mha(*(xs if len(xs) == 3 else xs * 3), need_weights=False, **kw)
        r = torch.randn_like(out)
        (out * r).sum().backward()
        for i, x in enumerate(inputs):
            w.put(f"{name}.in{i}", x)
            w.put(f"{name}.grad{i}", xs[i].grad)
        w.put(f"{name}.out", out)
        w.put(f"{name}.r", r)
        for k, p in mha.named_parameters():
            w.put(f"{name}.grad.{k}", p.grad)

    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    with torch.no_grad():  # biases that are not 0, so their gradients and use are checked
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    causal = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    mha_case("mha_self", mha, [rnd(2, 5, 8)], key_padding_mask=pad, attn_mask=causal)
    w.put("mha_self.key_padding_mask", pad)
    w.put("mha_self.attn_mask", causal)
    mha = torch.nn.MultiheadAttention(8, 4)
    with torch.no_grad():
        mha.in_proj_bias.normal_()
    fmask = rnd(4, 6)
    mha_case("mha_cross", mha, [rnd(4, 2, 8), rnd(6, 2, 8), rnd(6, 2, 8)], attn_mask=fmask)
    w.put("mha_cross.attn_mask", fmask)
    w.close()


def main():
    ops_file()
    mlp = torch.nn.Sequential(torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16),
                              torch.nn.GELU(), torch.nn.Linear(16, 10))
    train_file(os.path.join(HERE, "mlp.txt"), mlp, lambda: (torch.randn(8, 20), torch.randint(0, 10, (8,))),
               [("sgd", lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4)),
                ("adamw", lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.01))])
    cnn = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(4, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(8 * 3 * 3, 10))
    train_file(os.path.join(HERE, "cnn.txt"), cnn, lambda: (torch.randn(4, 1, 12, 12), torch.randint(0, 10, (4,))),
               [("sgd", lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True)),
                ("adam", lambda p: torch.optim.Adam(p, lr=1e-3))])
    residual_bf16_file(os.path.join(HERE, "residual_bf16.txt"))
    attention_file(os.path.join(HERE, "attention.txt"))


if __name__ == "__main__":
    main()
