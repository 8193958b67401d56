#!/usr/bin/env python3
"""The model of examples/gpt_char.cpp in PyTorch, for the comparison: the same configuration, the
same data split (first 90 % of the characters train, last 10 % validate, side-by-side validation
windows), the same initialisation scheme (GPT-2's: N(0, 0.02), residual projections
N(0, 0.02 / sqrt(2 layers)), zero biases), AdamW with weight decay on the matrices only, betas
(0.9, 0.99), warmup (min(100, steps / 10) steps from 0) then cosine to lr / 10, clipping at 1.0,
shuffled training windows at every offset. Prints the validation loss in nats per character every
--eval-every steps, and the median step time, in the example's format:

    python3 benchmarks/gpt_char_pytorch.py --steps 2000
    build/examples/gpt_char --steps 2000

The random streams differ from trainkit's (initial values, batch order), so losses agree in
distribution, not bit for bit.
"""
import argparse
import math
import platform
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

FORTUNES = ("/usr/share/games/fortunes/fortunes,/usr/share/games/fortunes/literature,"
            "/usr/share/games/fortunes/riddles")


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1 = nn.LayerNorm(c.embd)
        self.attn = nn.MultiheadAttention(c.embd, c.heads, dropout=c.dropout, batch_first=True)
        self.ln2 = nn.LayerNorm(c.embd)
        self.fc = nn.Linear(c.embd, 4 * c.embd)
        self.proj = nn.Linear(4 * c.embd, c.embd)
        self.drop = nn.Dropout(c.dropout)
        std_res = 0.02 / math.sqrt(2 * c.layers)
        for w, s in ((self.attn.in_proj_weight, 0.02), (self.attn.out_proj.weight, std_res),
                     (self.fc.weight, 0.02), (self.proj.weight, std_res)):
            nn.init.normal_(w, 0.0, s)
        for b in (self.attn.in_proj_bias, self.attn.out_proj.bias, self.fc.bias, self.proj.bias):
            nn.init.zeros_(b)

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False, is_causal=True)[0]
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.tok = nn.Embedding(c.vocab, c.embd)
        self.pos = nn.Parameter(torch.empty(c.context, c.embd))
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln = nn.LayerNorm(c.embd)
        nn.init.normal_(self.tok.weight, 0.0, 0.02)
        nn.init.normal_(self.pos, 0.0, 0.02)

    def forward(self, ids):
        t = ids.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=ids.device), diagonal=1)
        x = self.drop(self.tok(ids) + self.pos[:t])
        for b in self.blocks:
            x = b(x, mask)
        return F.linear(self.ln(x), self.tok.weight)  # tied head


def lr_at(k, c):
    warmup = min(100, c.steps // 10)
    if k < warmup:
        return c.lr * k / warmup
    if k >= c.steps:
        return c.lr / 10
    p = (k - warmup) / (c.steps - warmup)
    return c.lr / 10 + (c.lr - c.lr / 10) * 0.5 * (1 + math.cos(math.pi * p))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--text", default=FORTUNES)
    for k, v in (("steps", 2000), ("batch", 32), ("context", 64), ("layers", 4), ("embd", 128), ("heads", 4),
                 ("eval-every", 250), ("seed", 1)):
        ap.add_argument("--" + k, type=int, default=v)
    for k, v in (("dropout", 0.0), ("lr", 1e-3), ("weight-decay", 0.1), ("clip", 1.0)):
        ap.add_argument("--" + k, type=float, default=v)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    c = ap.parse_args()
    torch.manual_seed(c.seed)
    print(f"CPU: {platform.processor() or platform.machine()}; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")

    text = b"".join(open(p, "rb").read() for p in c.text.split(",") if p)
    symbols = sorted(set(text))
    c.vocab = len(symbols)
    index = {s: i for i, s in enumerate(symbols)}
    ids = torch.tensor([index[b] for b in text], dtype=torch.long)
    split = ids.numel() * 9 // 10
    train, val = ids[:split], ids[split:]
    n_val = (val.numel() - 1 - c.context) // c.context + 1
    val_x = torch.stack([val[i * c.context:(i + 1) * c.context] for i in range(n_val)])
    val_y = torch.stack([val[i * c.context + 1:(i + 1) * c.context + 1] for i in range(n_val)])
    print(f"text: {len(text)} characters, vocabulary {c.vocab}; train {split}, validation {ids.numel() - split}")

    model = GPT(c)
    print(f"model: {c.layers} layers, {c.embd} embedding, {c.heads} heads, context {c.context}; "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": c.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=c.lr, betas=(0.9, 0.99))
    n_windows = train.numel() - c.context
    order = torch.randperm(n_windows)
    at = 0
    times, losses = [], []
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=c.precision == "bf16")
    for k in range(c.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(k, c)
        if at + c.batch > n_windows:
            order, at = torch.randperm(n_windows), 0
        starts = order[at:at + c.batch]
        at += c.batch
        x = torch.stack([train[s:s + c.context] for s in starts])
        y = torch.stack([train[s + 1:s + c.context + 1] for s in starts])
        t0 = time.perf_counter()
        with autocast:
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, c.vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if c.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), c.clip)
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if (k + 1) % c.eval_every == 0 or k + 1 == c.steps:
            model.eval()
            with torch.no_grad(), autocast:
                vl = F.cross_entropy(model(val_x).float().reshape(-1, c.vocab), val_y.reshape(-1)).item()
            model.train()
            print(f"step {k + 1}  train loss {sum(losses) / len(losses):.4f}  val loss {vl:.4f} nats/char  "
                  f"{c.batch * c.context / statistics.median(times[-len(losses):]):.0f} chars/s", flush=True)
            losses = []
    print(f"median step {1e3 * statistics.median(times[len(times) // 10:]):.2f} ms")


if __name__ == "__main__":
    main()
