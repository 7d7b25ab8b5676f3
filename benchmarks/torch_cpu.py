"""theseus against PyTorch eager on the CPU, on nanoGPT's Shakespeare-char CPU configuration
(4 layers, 4 heads, d_model 128, context 64, batch 12, AdamW): training tokens/s, one run,
the two sides interleaved (windows of steps, A B B A ...), reported as a ratio of medians.

    python benchmarks/torch_cpu.py [--rounds 6 --steps 20]

The PyTorch model is the same GPT (learned positions, pre-norm blocks, LayerNorm with
biases, tanh GELU, tied head, the same padded vocabulary), with AdamW, clipping at 1.0 and
``F.scaled_dot_product_attention``, on the same batches, run at PyTorch's default threads and
at one thread (on a loaded machine its spinning OpenMP threads can cost it more than they
give; the ratio is against the faster). theseus uses the cores as a user would on a CPU:
``mesh.cpu_devices``, one device per core (``--cpu-devices 0``: JAX's single device). Data: Shakespeare
(``/work/shared/data/tinyshakespeare.txt`` or ``--data``) when present, else the stdlib corpus.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import jax
import numpy as np
import torch
import torch.nn.functional as F
from common import device_batch, interleaved, make_run, save, show, spread
from torch import nn

SHAKESPEARE = Path("/work/shared/data/tinyshakespeare.txt")
CONFIG = ["architecture.n_layers=4", "architecture.n_heads=4", "architecture.d_model=128", "architecture.seq_len=64",
          "architecture.dropout=0.0", "trainer.batch_size=12", "trainer.grad_accum=1", "optimizer.lr=1e-3",
          "optimizer.warmup_steps=10"]


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, seq, d]
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class TorchGPT(nn.Module):
    def __init__(self, vocab: int, seq: int, d: int, layers: int, heads: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [batch, seq] -> logits [batch, seq, vocab]
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


class TorchSide:
    """PyTorch eager with ``threads`` intra-op threads (set for each window)."""

    def __init__(self, run, batches: list[np.ndarray], threads: int):
        self.threads = threads
        m = run.model
        torch.manual_seed(0)
        self.model = TorchGPT(m.vocab_size, m.seq_len, m.d_model, m.n_layers, m.n_heads)
        o = run.settings.optimizer
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=o.lr, betas=(o.b1, o.b2), eps=o.eps,
                                     weight_decay=o.weight_decay)
        self.batches = [torch.from_numpy(b.astype(np.int64)) for b in batches]
        self.loss = math.nan

    def window(self, steps: int) -> float:
        torch.set_num_threads(self.threads)
        began = time.perf_counter()
        for i in range(steps):
            tokens = self.batches[i % len(self.batches)]
            logits = self.model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
        self.loss = loss.item()
        return (time.perf_counter() - began) / steps


class JaxSide:
    def __init__(self, run, batches: list[np.ndarray]):
        self.compiled = run.compiled
        self.state = self.compiled.init()
        self.batches = [device_batch(run, b) for b in batches]
        self.key = jax.random.key(0)
        self.loss = math.nan

    def window(self, steps: int) -> float:
        began = time.perf_counter()
        for i in range(steps):
            self.state, metrics = self.compiled.step(self.state, self.batches[i % len(self.batches)], self.key)
        self.loss = float(metrics["loss"])  # waits for the last step
        return (time.perf_counter() - began) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=SHAKESPEARE)
    parser.add_argument("--rounds", type=int, default=6, help="timed windows per side")
    parser.add_argument("--steps", type=int, default=20, help="steps per window")
    parser.add_argument("--cpu-devices", type=int, default=None,
                        help="mesh.cpu_devices (default: unset, theseus's own choice: a device per core)")
    parser.add_argument("--extra", nargs="*", default=[], help="more theseus overrides (e.g. XLA-side knobs)")
    args = parser.parse_args()
    data = ["data.source=text", f"data.path={args.data}", "data.tokenizer=char"] if args.data.is_file() else []
    devices = [f"mesh.cpu_devices={args.cpu_devices}"] if args.cpu_devices is not None else []
    run = make_run(["+experiment=gpt_tiny", *data, *CONFIG, *devices, *args.extra])
    loader = run.dataset.loader("train", run.model.seq_len, run.settings.trainer.batch_size, seed=0)
    batches = [next(loader) for _ in range(8)]  # [1, batch, seq + 1] each
    loader.close()
    flat = [b.reshape(-1, b.shape[-1]) for b in batches]  # [batch, seq + 1]
    threads = torch.get_num_threads()
    sides = {"theseus": JaxSide(run, batches), "torch": TorchSide(run, flat, threads)}
    if threads > 1:  # on a loaded machine, spinning OpenMP threads can cost PyTorch more than they give
        sides["torch 1 thread"] = TorchSide(run, flat, 1)
    for side in sides.values():
        side.window(3)  # warm-up: compilation, allocation
    samples = interleaved({name: lambda s=side: s.window(args.steps) for name, side in sides.items()}, args.rounds)
    tokens = run.tokens_per_step
    rate = {name: tokens / spread(values)["median"] for name, values in samples.items()}
    best_torch = max(v for name, v in rate.items() if name.startswith("torch"))
    results = {"data": str(args.data) if data else "stdlib", "overrides": [*CONFIG, *devices, *args.extra],
               "torch_threads": threads, "steps_per_window": args.steps, "samples_s_per_step": samples,
               "tokens_per_s": rate, "ratio": rate["theseus"] / best_torch,  # against PyTorch's faster setting
               "last_loss": {name: side.loss for name, side in sides.items()}}
    show("CPU training, Shakespeare-char configuration (median of windows)", ["side", "tokens/s", "last loss"],
         [*((name, f"{rate[name]:,.0f}", sides[name].loss) for name in sides),
          ("theseus / faster torch", results["ratio"], "")],
         note="goal: > 1, aiming at 1.5")
    save("torch_cpu", results)


if __name__ == "__main__":
    main()
