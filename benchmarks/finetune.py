"""Fine-tuning on the CPU: theseus's train step against transformers (+ peft) on the same cores.

A SmolLM2-135M-shaped Llama (30 layers, d_model 576, 9 heads, 3 kv heads, d_ff 1536, a 49,152
vocabulary, tied embeddings) with random weights, built by transformers and saved to a temporary
folder, or a real model given with ``--model`` (a Hugging Face folder, or a GGUF file: theseus
reads it as ``trainer.init_from``, transformers with ``gguf_file=``). Both sides start from the
same weights and train on the same batches (``--batch`` x ``--seq`` tokens from theseus's loader
over a local text), in float32 (``--matmul bfloat16``: the weights' products in bfloat16, theseus's
``architecture.dtype.matmul=bfloat16`` against ``torch.autocast``), with AdamW and clipping at 1.0:

- full fine-tune: every weight trains;
- LoRA: rank 8 on q and v (peft's ``LoraConfig(r=8, lora_alpha=8, target_modules=[q_proj, v_proj])``
  against ``architecture.lora.rank=8``), the base frozen.

theseus runs at its defaults for the CPU (a JAX device per core, the batch split over them);
PyTorch with ``torch.set_num_threads`` = the cores JAX uses, and with ``--torch-threads`` more
settings beside (on a loaded machine PyTorch's spinning OpenMP threads can cost it more than they
give: the ratio is against its fastest). The sides take turns (A B B A ...), each turn a fresh
process that builds its side, runs a first window and then a timed one of ``--steps`` steps,
one side's process at a time: in one process PyTorch's OpenMP threads and XLA's took each
other's cores, and with every side's process resident this virtual machine ran them all slower.
Reported per case: seconds per step (median of windows), torch / theseus (> 1:
theseus is faster) as a ratio of medians, as the median of paired windows and as best window
against best window (the issue's reading, steady where PyTorch is bimodal), the CPU seconds
each side's process spent per step (on a loaded machine, where wall time measures the
scheduler's share as much as the work), the first step's loss on each side (the same weights
and batch: they must agree), XLA's FLOPs of the step, and the load average while it ran.

    python benchmarks/finetune.py [--cases full lora] [--rounds 4 --steps 2] [--model PATH] [--layers 30]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
import torch
import torch.nn.functional as F
from common import ROOT, child, device_batch, interleaved, make_run, save, show, spread

from theseus.base.host_allocator import huge_pages_wanted, with_huge_pages

# SmolLM2-135M's shape (its config.json), the weights random
SMOLLM2 = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
           "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "tie_word_embeddings": True}
LR, BETAS, EPS, DECAY, CLIP, RANK = 3e-4, (0.9, 0.95), 1e-8, 0.1, 1.0, 8
TEXT = [ROOT / "README.md", *sorted((ROOT / "theseus" / "training").glob("*.py"))]  # a local corpus, any will do


def random_smollm2(folder: Path, layers: int) -> Path:
    """A SmolLM2-shaped Llama with random weights (``layers`` deep), saved by transformers."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**SMOLLM2, "num_hidden_layers": layers}, bos_token_id=None,
                                      eos_token_id=None, pad_token_id=None)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def theseus_overrides(model: Path, corpus: Path, case: str, batch: int, seq: int, matmul: str) -> list[str]:
    """The same job as theseus overrides: the model, the batch, AdamW at a constant rate, the
    weights' products in ``matmul`` (``architecture.dtype.matmul``)."""
    lora = [f"architecture.lora.rank={RANK}", f"architecture.lora.alpha={RANK}", "architecture.lora.targets=[q,v]"]
    return [f"trainer.init_from={model}", f"architecture.seq_len={seq}", f"trainer.batch_size={batch}",
            "trainer.grad_accum=1", "trainer.max_steps=1000", "data.source=text", f"data.path={corpus}",
            "optimizer=adamw", f"optimizer.lr={LR}", f"optimizer.b1={BETAS[0]}", f"optimizer.b2={BETAS[1]}",
            f"optimizer.eps={EPS}", f"optimizer.weight_decay={DECAY}", f"optimizer.clip_norm={CLIP}",
            "optimizer.schedule=constant", "optimizer.warmup_steps=0", f"architecture.dtype.matmul={matmul}",
            *(lora if case == "lora" else [])]


class Theseus:
    """theseus's compiled train step (``run.compiled.step``) from the model's weights."""

    def __init__(self, run, batches: np.ndarray):
        self.run = run
        self.step = run.compiled.step
        self.state, _ = run.start(run.compiled, lambda _: None)
        self.batches = [device_batch(run, b) for b in batches]
        self.key = jax.random.key(0)
        self.done = 0

    def window(self, steps: int) -> dict:
        began, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            self.state, metrics = self.step(self.state, self.batches[self.done % len(self.batches)], self.key)
            self.done += 1
        loss = float(metrics["loss"])  # waits for the last step
        return timing(began, cpu, steps, loss)

    def summary(self) -> dict:
        return {"jax_devices": self.run.mesh_shape, "xla_flops": self.run.compiled.xla_flops,
                "analytic_flops": self.run.flops_per_step}


class Transformers:
    """transformers' model (+ peft's LoRA) with torch's AdamW and clipping, eager, float32."""

    def __init__(self, model: Path, case: str, batches: np.ndarray, threads: int, matmul: str):
        import transformers

        self.autocast = matmul == "bfloat16"  # torch.autocast: the products in bfloat16, the weights float32
        torch.set_num_threads(threads)
        where = dict(gguf_file=model.name) if model.suffix == ".gguf" else {}
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            model.parent if where else model, dtype=torch.float32, attn_implementation="sdpa", **where)
        if case == "lora":
            import peft

            self.model = peft.get_peft_model(self.model, peft.LoraConfig(
                r=RANK, lora_alpha=RANK, lora_dropout=0.0, target_modules=["q_proj", "v_proj"]))
        self.model.train()
        trained = [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]
        self.params = [p for _, p in trained]
        decay = [p for name, p in trained if p.ndim >= 2 and "embed" not in name]  # theseus's rule: weights decay
        rest = [p for name, p in trained if not (p.ndim >= 2 and "embed" not in name)]
        self.optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": DECAY},
                                            {"params": rest, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
        self.batches = [torch.from_numpy(b.reshape(-1, b.shape[-1]).astype(np.int64)) for b in batches]
        self.done = 0

    def window(self, steps: int) -> dict:
        began, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            tokens = self.batches[self.done % len(self.batches)]
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
                logits = self.model(input_ids=tokens[:, :-1]).logits
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.params, CLIP)
            self.optimizer.step()
            self.done += 1
        return timing(began, cpu, steps, loss.item())

    def summary(self) -> dict:
        return {"trained_params": int(sum(p.numel() for p in self.params))}


def timing(began: float, cpu: float, steps: int, loss: float) -> dict:
    """A window's answer: wall and CPU seconds per step since ``began``/``cpu``, the last loss, the load."""
    return {"seconds": (time.perf_counter() - began) / steps, "cpu": (time.process_time() - cpu) / steps,
            "loss": loss, "load": os.getloadavg()[0]}


def torch_side(threads: int) -> str:
    return f"transformers, {threads} thread{'s' if threads > 1 else ''}"


def side(name: str, case: str, model: Path, corpus: Path, args):
    """Side ``name`` ("theseus" or "torch:THREADS") of ``case``, built in this process."""
    batches = np.load(corpus.with_suffix(".npy"))  # [4, 1, batch, seq + 1]: the batches every side trains on
    if name == "theseus":
        return Theseus(make_run(theseus_overrides(model, corpus, case, args.batch, args.seq, args.matmul)), batches)
    return Transformers(model, case, batches, int(name.split(":")[1]), args.matmul)


def measure(case: str, model: Path, corpus: Path, options: list[str], args) -> dict:
    """One case: its sides take turns (A B B A ...), each turn a fresh process that builds
    its side, runs a first window (compilation, allocation) and then the timed one. One side's
    process at a time: with all of them resident (a full fine-tune holds ~4 GB a side), this
    virtual machine ran every side up to 2x slower, theseus's most."""
    names = {"theseus": "theseus", **{torch_side(n): f"torch:{n}" for n in args.torch_threads}}
    # theseus's side in the process a theseus command runs in (huge pages for malloc on a CPU host)
    command_environ = with_huge_pages(os.environ) if huge_pages_wanted() else None
    windows: dict[str, list[dict]] = {name: [] for name in names}

    def turn(name):
        def call():
            answer = child(__file__, *options, "--side", names[name], case, str(model), str(corpus),
                           env=command_environ if name == "theseus" else None)
            windows[name].append(answer)
            print(f"{case}, {name}: {answer['seconds']:.3f} s/step, load {answer['load']:.1f}", file=sys.stderr,
                  flush=True)
            return answer["seconds"]
        return call

    samples = interleaved({name: turn(name) for name in names}, args.rounds)
    fastest = min((name for name in names if name != "theseus"), key=lambda name: np.median(samples[name]))
    ours = windows["theseus"][0]
    return {"overrides": theseus_overrides(model, corpus, case, args.batch, args.seq, args.matmul),
            "jax_devices": ours["jax_devices"], "trained_params": windows[fastest][0]["trained_params"],
            "step_s": {name: spread(v) for name, v in samples.items()}, "fastest_torch": fastest,
            "cpu_s_per_step": {name: spread([w["cpu"] for w in windows[name]]) for name in names},
            "ratio": float(np.median(samples[fastest]) / np.median(samples["theseus"])),
            "paired_ratio": float(np.median(np.divide(samples[fastest], samples["theseus"]))),
            # best window against best window (issue #53's own reading): PyTorch's full step is bimodal
            # from one process to the next (4.3-5.0 s or 5.5-7.9 s on the Xeon), theseus's is not
            "best_ratio": float(min(min(samples[name]) for name in names if name != "theseus")
                                / min(samples["theseus"])),
            "first_loss": {name: windows[name][0]["first"]["loss"] for name in names},
            "last_loss": {name: windows[name][-1]["loss"] for name in names},
            "first_window_s": {name: spread([w["first"]["seconds"] for w in windows[name]]) for name in names},
            "xla_flops": ours["xla_flops"], "analytic_flops": ours["analytic_flops"],
            "load": spread([w["load"] for name in names for w in windows[name]]), "samples": samples}


def batches(model: Path, corpus: Path, args) -> np.ndarray:
    """Four batches from theseus's loader over ``corpus``: ``[4, 1, batch, seq + 1]`` tokens."""
    run = make_run(theseus_overrides(model, corpus, "full", args.batch, args.seq, args.matmul), steps=None)
    loader = run.dataset.loader("train", run.model.seq_len, args.batch, seed=0)
    taken = np.stack([next(loader) for _ in range(4)])
    loader.close()
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a Hugging Face folder or a GGUF file (default: a random "
                                                   "SmolLM2-135M-shaped Llama)")
    parser.add_argument("--layers", type=int, default=SMOLLM2["num_hidden_layers"],
                        help="layers of the random model (30: SmolLM2-135M's)")
    parser.add_argument("--cases", nargs="+", default=["full", "lora"], choices=["full", "lora"])
    parser.add_argument("--batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--rounds", type=int, default=4, help="timed windows per side")
    parser.add_argument("--steps", type=int, default=2, help="steps per window")
    parser.add_argument("--matmul", choices=["float32", "bfloat16"], default="float32",
                        help="the weights' products: float32, or bfloat16 with float32 weights and sums "
                             "(theseus: architecture.dtype.matmul; PyTorch: torch.autocast)")
    parser.add_argument("--torch-threads", type=int, nargs="+", default=[len(os.sched_getaffinity(0))],
                        help="PyTorch's intra-op threads, one side each (default: the cores JAX uses)")
    parser.add_argument("--side", nargs=4, metavar=("SIDE", "CASE", "MODEL", "CORPUS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:  # one turn of one side of one case: its first window, then the timed one, as JSON
        name, case, model, corpus = args.side
        built = side(name, case, Path(model), Path(corpus), args)
        first = built.window(1)
        return print(json.dumps({**built.window(args.steps), "first": first, **built.summary()}))
    if args.model is not None and not args.model.exists():
        parser.error(f"--model {args.model} does not exist: give a Hugging Face folder or a .gguf file")
    options = [f"--{key.replace('_', '-')}={value}" for key, value in vars(args).items()
               if key in ("batch", "seq", "steps", "matmul")]
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text("\n\n".join(path.read_text() for path in TEXT))
        model = args.model.resolve() if args.model else random_smollm2(Path(tmp) / "smollm2", args.layers)
        np.save(corpus.with_suffix(".npy"), batches(model, corpus, args))
        results = {case: measure(case, model, corpus, options, args) for case in args.cases}
    rows = [(case, r["step_s"]["theseus"]["median"],
             ", ".join(f"{r['step_s'][torch_side(n)]['median']:.3f}" for n in args.torch_threads), r["ratio"],
             r["paired_ratio"], r["best_ratio"], f"{r['cpu_s_per_step']['theseus']['median']:.3f} / "
             f"{r['cpu_s_per_step'][r['fastest_torch']]['median']:.3f}",
             f"{r['first_loss']['theseus']:.5f} / {r['first_loss'][r['fastest_torch']]:.5f}",
             f"{r['xla_flops']:.3e}", f"{r['load']['min']:.1f}-{r['load']['max']:.1f}")
            for case, r in results.items()]
    show(f"fine-tuning step, {args.model or f'random SmolLM2-135M shape ({args.layers} layers)'}, batch "
         f"{args.batch} x {args.seq}, {args.matmul} products (median of {args.rounds} windows of {args.steps} steps, interleaved)",
         ["case", "theseus s/step", f"transformers s/step ({', '.join(map(str, args.torch_threads))} threads)",
          "fastest torch / theseus", "paired", "best / best", "CPU s/step (theseus / torch)",
          "first loss (theseus / torch)",
          "XLA FLOPs", "load"], rows, note="> 1: theseus is faster; target >= 1.0, aiming at 1.5")
    save("finetune", {"model": str(args.model or f"random SmolLM2-135M shape, {args.layers} layers"),
                      "batch": args.batch, "seq": args.seq, "rounds": args.rounds, "steps": args.steps,
                      "matmul": args.matmul,
                      "torch": torch.__version__, "cases": results})
    if any(math.isnan(r["first_loss"]["theseus"]) for r in results.values()):
        raise SystemExit("theseus's loss is not finite")


if __name__ == "__main__":
    main()
