"""theseus at its defaults against nanoGPT's own ``train.py`` (PyTorch eager on the CPU), on
nanoGPT's README configuration for a CPU: Shakespeare characters, 4 layers, 4 heads, d_model 128,
context 64, batch 12, no dropout, lr 1e-3 to 1e-4 over 2000 iterations, beta2 0.99.

    python benchmarks/nanogpt.py --nanogpt PATH/TO/nanoGPT [--iters 2000 --rounds 2]

PATH is a checkout of github.com/karpathy/nanoGPT (never copied here). Both sides train on the
same token files: nanoGPT's ``data/shakespeare_char/prepare.py`` writes ``train.bin``/``val.bin``
from the local text (``--data``), and theseus reads that folder as shards (``data.source=shards``),
with the same character ids. The sides run alternated (nanoGPT, theseus, theseus, nanoGPT, ...),
each a fresh process of its own command line, so the machine's load falls on both. Reported per
side: tokens/s of a training iteration (the median over the run, past its first 10%), the
validation loss both estimate at the last iteration (nanoGPT: 20 batches; theseus: the same
count), and the whole process's wall time. Goal: theseus at least 1.5x nanoGPT's tokens/s at
equal loss.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import save, show, spread, stopwatch

SHAKESPEARE = Path("/work/shared/data/tinyshakespeare.txt")
DATASET = "shakespeare_char"
TOKENS_PER_ITER = 12 * 64
EVAL_ITERS = 20
NANOGPT_ARGS = ["config/train_shakespeare_char.py", "--device=cpu", "--compile=False", f"--eval_iters={EVAL_ITERS}",
                "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4", "--n_head=4", "--n_embd=128",
                "--dropout=0.0", "--always_save_checkpoint=False"]
ITER_LINE = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms")
VAL_LINE = re.compile(r"^step (\d+): train loss [\d.]+, val loss ([\d.]+)")


def theseus_args(folder: Path, iters: int) -> list[str]:
    """nanoGPT's CPU configuration as theseus overrides; everything else at theseus's defaults."""
    return ["data.source=shards", f"data.path={folder}", "data.tokenizer=char", "architecture.n_layers=4",
            "architecture.n_heads=4", "architecture.d_model=128", "architecture.seq_len=64", "architecture.bias=false",
            "trainer.batch_size=12", f"trainer.max_steps={iters}", "trainer.log_every=10",
            f"trainer.eval_every={iters}", f"trainer.eval_batches={EVAL_ITERS}", f"trainer.checkpoint_every={iters}",
            "optimizer.lr=1e-3", "optimizer.b2=0.99", "logger.mode=disabled"]


def prepare(nanogpt: Path, text: Path, work: Path) -> Path:
    """A nanoGPT working folder in ``work`` (its scripts linked, not copied) with the token files
    of ``text`` made by nanoGPT's own prepare.py, and theseus's meta.json and chars.json beside."""
    for name in ("train.py", "model.py", "configurator.py", "config"):
        (work / name).symlink_to(nanogpt / name)
    folder = work / "data" / DATASET
    folder.mkdir(parents=True)
    (folder / "input.txt").write_bytes(text.read_bytes())
    (folder / "prepare.py").symlink_to(nanogpt / "data" / DATASET / "prepare.py")
    subprocess.run([sys.executable, "prepare.py"], cwd=folder, check=True, capture_output=True)
    meta = pickle.loads((folder / "meta.pkl").read_bytes())
    symbols = "".join(meta["itos"][i] for i in range(meta["vocab_size"]))
    (folder / "chars.json").write_text(json.dumps(symbols))
    counts = {split: (folder / f"{split}.bin").stat().st_size // 2 for split in ("train", "val")}
    (folder / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": meta["vocab_size"],
                                                  "tokenizer": "char", "counts": counts}))
    return folder


def steady(values: list[float]) -> float:
    """The median past the first 10% (compilation, warm caches)."""
    return statistics.median(values[len(values) // 10:])


def run_nanogpt(work: Path, iters: int) -> dict[str, float]:
    args = [*NANOGPT_ARGS, f"--max_iters={iters}", f"--lr_decay_iters={iters}", f"--eval_interval={iters}",
            f"--out_dir={work / 'out'}"]
    seconds, proc = stopwatch(lambda: subprocess.run([sys.executable, "train.py", *args], cwd=work,
                                                     check=False, capture_output=True, text=True))
    if proc.returncode:
        raise RuntimeError(f"nanoGPT's train.py failed:\n{proc.stderr[-2000:]}")
    lines = proc.stdout.splitlines()
    ms = [float(m[2]) for m in map(ITER_LINE.match, lines) if m and int(m[1]) > 0]
    val = [float(m[2]) for m in map(VAL_LINE.match, lines) if m and int(m[1]) == iters]
    return {"tokens_per_s": TOKENS_PER_ITER / (steady(ms) / 1000), "val_loss": val[-1], "wall_s": seconds}


def run_theseus(folder: Path, iters: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as run_dir:
        command = [sys.executable, "-m", "theseus.run", *theseus_args(folder, iters), f"hydra.run.dir={run_dir}"]
        seconds, proc = stopwatch(lambda: subprocess.run(command, check=False, cwd=run_dir, capture_output=True, text=True))
        if proc.returncode:
            raise RuntimeError(f"theseus failed:\n{proc.stderr[-2000:]}")
        rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    step_s = [row["step_time"] for row in rows if "step_time" in row]
    val = [row["val_loss"] for row in rows if "val_loss" in row and row["step"] == iters]
    return {"tokens_per_s": TOKENS_PER_ITER / steady(step_s), "val_loss": val[-1], "wall_s": seconds}


def versions() -> dict[str, str]:
    """What the step depends on: the libraries and the compiler flags of each side."""
    import jax
    import jaxlib
    import torch

    from theseus.base.mesh import compiler_options

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "torch": torch.__version__,
            "torch_threads": str(torch.get_num_threads()), "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "theseus_compiler_options": json.dumps(compiler_options([jax.devices("cpu")[0]] * 2))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nanogpt", type=Path, default=os.environ.get("NANOGPT"), required="NANOGPT" not in os.environ,
                        help="a checkout of nanoGPT (or set NANOGPT)")
    parser.add_argument("--data", type=Path, default=SHAKESPEARE, help="the text both sides train on")
    parser.add_argument("--iters", type=int, default=2000, help="training iterations of each run (nanoGPT's README: 2000)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, alternated")
    args = parser.parse_args()
    if not (args.nanogpt / "train.py").is_file():
        parser.error(f"--nanogpt {args.nanogpt} holds no train.py: give a checkout of github.com/karpathy/nanoGPT")
    if not args.data.is_file():
        parser.error(f"--data {args.data} is not a file: give a local text to train on")
    samples: dict[str, list[dict[str, float]]] = {"nanoGPT": [], "theseus": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder = prepare(args.nanogpt.resolve(), args.data, work)
        sides = {"nanoGPT": lambda: run_nanogpt(work, args.iters), "theseus": lambda: run_theseus(folder, args.iters)}
        for r in range(args.rounds):
            for name in sides if r % 2 == 0 else reversed(sides):
                samples[name].append(sides[name]())
                print(name, samples[name][-1], f"load {os.getloadavg()[0]:.1f}", flush=True)
    summary = {name: {key: spread([run[key] for run in runs]) for key in runs[0]} for name, runs in samples.items()}
    ratio = summary["theseus"]["tokens_per_s"]["median"] / summary["nanoGPT"]["tokens_per_s"]["median"]
    show(f"theseus vs nanoGPT's train.py, {args.iters} iterations, {args.rounds} runs each (medians)",
         ["side", "tokens/s", "val_loss", "wall s"],
         [[name, s["tokens_per_s"]["median"], s["val_loss"]["median"], s["wall_s"]["median"]]
          for name, s in summary.items()],
         note=f"theseus / nanoGPT tokens/s: {ratio:.3f} (goal >= 1.5)")
    save("nanogpt", {"iters": args.iters, "rounds": args.rounds, "versions": versions(), "samples": samples,
                     "summary": summary, "tokens_per_s_ratio": ratio})


if __name__ == "__main__":
    main()
