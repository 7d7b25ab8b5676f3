"""theseus's batched generation against transformers' ``generate`` on the same model, and the whole
``theseus.sample FOLDER --chat MESSAGE`` command against a plain transformers script.

    python benchmarks/generation.py [--folder DIR] [--rounds 3] [--new-tokens 128] [--command-rounds 3]

The model: SmolLM2-135M's shape (Llama: 30 layers, d_model 576, 9 heads, 3 kv heads, d_ff 1536,
vocabulary 49,152, tied embeddings) with random weights and a byte-level BPE of 49,152 ids
trained here with a ChatML template (nothing downloaded), or a Hugging Face folder given with
``--folder`` (its config, weights, tokenizer.json and chat template). Both sides compute in
float32 on the CPU at their default threads.

In process: one prompt and a batch of 8 (32-token prompts), greedy and sampled (temperature 0.7,
top-p 0.9), ``--new-tokens`` tokens each (no stop token: every row makes them all); theseus's
``complete`` and transformers' ``generate`` (at PyTorch's default threads, and at one thread: on
a loaded machine its spinning threads can cost it more than they give; the ratio is against the
faster) alternate (A B C C B A ...) ``--rounds`` times. Each
measurement is the whole call for 1 token and for all of them; the first gives the time to the
first token, their difference the tokens/s after it. Greedy replies are compared token for token.

The command: the reply to ``--message`` (greedy, ``--new-tokens`` tokens) from a fresh process, as
a user waits for it (start-up, loading, tracing, compilation, generation): ``theseus.sample`` with
JAX's compilation cache empty (the first run of a command) and filled (every later one), and a
transformers script that loads the folder and calls ``apply_chat_template`` and ``generate``,
alternated ``--command-rounds`` times; seconds and peak resident memory of each.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
from common import interleaved, save, show, spread

SMOLLM2 = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
           "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
           "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
MESSAGE = "Tell me about the history of Paris."
SAMPLED = {"temperature": 0.7, "top_p": 0.9}
PROMPT = 32
SIDES = ("theseus", "transformers", "transformers, 1 thread")

# what a user of transformers writes to get the same reply: load, render, generate greedily, print
TRANSFORMERS_CHAT = """
import sys, torch, transformers
folder, message, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
model = transformers.AutoModelForCausalLM.from_pretrained(folder)
ids = tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                    return_tensors="pt", return_dict=True)["input_ids"]
with torch.no_grad():
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new)
print(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
"""


def random_folder(folder: Path, layers: int | None = None) -> Path:
    """SmolLM2-135M's shape with random weights (``layers``: fewer, for a quick run) and a BPE of
    its vocabulary trained on this Python's standard library, with a ChatML template."""
    import tokenizers
    import torch
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    shape = {**SMOLLM2, **({"num_hidden_layers": layers} if layers else {})}
    config = transformers.LlamaConfig(**shape, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))[:800]
    tokenizer.train_from_iterator((f.read_text(errors="ignore") for f in files),
                                  trainers.BpeTrainer(vocab_size=shape["vocab_size"], special_tokens=SPECIAL,
                                                      show_progress=False,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer.save(str(folder / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[1], "eos_token": SPECIAL[2],
                "pad_token": SPECIAL[2], "chat_template": CHATML}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    return folder


def in_process(folder: Path, batches: list[int], new: int, rounds: int) -> dict:
    """Tokens/s after the first token and time to it, theseus vs transformers, each case interleaved."""
    import jax
    import torch
    import transformers

    from theseus.model.generate import complete
    from theseus.model.sampling import Sampling
    from theseus.cli.trained import load_trained

    trained = load_trained(folder)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    hf.generation_config.eos_token_id = None  # every row makes every token, as theseus's without stop tokens
    hf.generation_config.pad_token_id = 0
    vocab = trained.tokenizer.vocab_size
    default = threads = torch.get_num_threads()
    results = {}
    for batch in batches:
        prompts = np.random.default_rng(batch).integers(0, vocab, (batch, PROMPT)).astype(np.int32)
        for mode, settings in (("greedy", {"temperature": 0.0}), ("sampled", SAMPLED)):
            sampling = Sampling(settings["temperature"], None, settings.get("top_p"))
            keys = jax.random.split(jax.random.key(0), batch)

            def ours(n: int) -> tuple[float, np.ndarray]:
                began = time.perf_counter()
                out = complete(trained.model, trained.params, prompts, [PROMPT] * batch, n, sampling, keys=keys,
                               vocab_size=vocab)
                tokens = np.asarray(out.tokens)
                return time.perf_counter() - began, tokens

            def theirs(n: int, threads: int = threads) -> tuple[float, np.ndarray]:
                ids = torch.from_numpy(prompts.astype(np.int64))
                extra = {"do_sample": True, "top_k": 0, **settings} if mode == "sampled" else {"do_sample": False}
                torch.set_num_threads(threads)
                began = time.perf_counter()
                with torch.no_grad():
                    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                      **extra)
                seconds = time.perf_counter() - began
                torch.set_num_threads(default)
                return seconds, out[:, PROMPT:].numpy()

            names = {"theseus": ours, "transformers": theirs,
                     "transformers, 1 thread": functools.partial(theirs, threads=1)}
            firsts: dict[str, list[float]] = {name: [] for name in names}
            replies: dict[str, np.ndarray] = {}

            def side(name, run):
                def measure() -> float:
                    first, _ = run(1)
                    whole, replies[name] = run(new)
                    firsts[name].append(first)
                    return whole - first
                return measure

            for run in names.values():  # compiled (theseus) and warmed up (all) before the clock
                run(1), run(new)
            after = interleaved({name: side(name, run) for name, run in names.items()}, rounds)
            case = {name: {"tokens_per_s_after_first": batch * (new - 1) / statistics.median(seconds),
                           "after_first_s": spread(seconds), "first_token_s": spread(firsts[name])}
                    for name, seconds in after.items()}
            faster = max(case[name]["tokens_per_s_after_first"] for name in names if name != "theseus")
            case["speedup"] = case["theseus"]["tokens_per_s_after_first"] / faster
            if mode == "greedy":
                same = replies["theseus"] == replies["transformers"]
                case["greedy_equal_tokens"] = int(np.cumprod(same, axis=1).sum(axis=1).min())
            results[f"batch {batch} {mode}"] = case
    return results


# runs a command and writes its seconds and peak resident KiB: the process that forks it is this small
# one (Linux counts the forking process's resident memory into a child's peak, up to its exec)
MEASURED = """
import resource, subprocess, sys, time
began = time.perf_counter()
code = subprocess.call(sys.argv[2:])
seconds = time.perf_counter() - began
open(sys.argv[1], "w").write(f"{seconds} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}")
sys.exit(code)
"""


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """``(seconds, peak resident MiB, stdout)`` of a fresh process."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "measured"
        proc = subprocess.run([sys.executable, "-c", MEASURED, str(report), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, env=env, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed")
        seconds, peak = report.read_text().split()
    return float(seconds), int(peak) / 1024, proc.stdout


def commands(folder: Path, new: int, rounds: int, message: str) -> dict:
    """The whole command's time to a reply: theseus.sample (compilation cache empty, and filled)
    and the transformers script, fresh processes, interleaved."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    sample = [sys.executable, "-m", "theseus.sample", str(folder), "--chat", message, "--temperature", "0",
              "--max-new-tokens", str(new)]
    script = [sys.executable, "-c", TRANSFORMERS_CHAT, str(folder), message, str(new)]
    memory: dict[str, list[float]] = {}
    replies: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as warm:
        def side(name: str, args: list[str], cache: str | None = None):
            def run() -> float:
                with tempfile.TemporaryDirectory() as cold:
                    seconds, peak, replies[name] = timed(args, {**env, "JAX_COMPILATION_CACHE_DIR": cache or cold})
                memory.setdefault(name, []).append(peak)
                return seconds
            return run

        timed(sample, {**env, "JAX_COMPILATION_CACHE_DIR": warm})  # fills the warm cache
        seconds = interleaved({"theseus, cache empty": side("theseus, cache empty", sample),
                               "theseus, cache filled": side("theseus, cache filled", sample, warm),
                               "transformers": side("transformers", script)}, rounds)
    out = {name: {"seconds": spread(values), "peak_mib": spread(memory[name])} for name, values in seconds.items()}
    out["same_reply"] = replies["theseus, cache filled"].strip() == replies["transformers"].strip()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, default=None, help="a Hugging Face folder (default: SmolLM2's shape, random)")
    parser.add_argument("--layers", type=int, default=None, help="the random model's layers (default: SmolLM2's 30)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--command-rounds", type=int, default=3, help="0: no command timing")
    parser.add_argument("--message", default=MESSAGE)
    args = parser.parse_args()
    import torch

    with tempfile.TemporaryDirectory() as scratch:
        folder = args.folder or random_folder(Path(scratch) / "smollm2-shape", args.layers)
        results = {"model": str(args.folder) if args.folder else f"SmolLM2-135M's shape, random weights "
                                                                   f"({args.layers or 30} layers)",
                   "new_tokens": args.new_tokens, "prompt_tokens": PROMPT, "torch_threads": torch.get_num_threads(),
                   "load_average": os.getloadavg()}
        results["generation"] = in_process(folder, args.batches, args.new_tokens, args.rounds)
        if args.command_rounds:
            results["command"] = commands(folder, args.new_tokens, args.command_rounds, args.message)
        results["load_average_after"] = os.getloadavg()
    rows = [(case, *(f"{v[name]['tokens_per_s_after_first']:.1f}" for name in SIDES), f"{v['speedup']:.2f}x",
             *(f"{v[name]['first_token_s']['median']:.3f}" for name in SIDES[:2]), str(v.get("greedy_equal_tokens", "")))
            for case, v in results["generation"].items()]
    show(f"generation, {args.new_tokens} new tokens after {PROMPT}-token prompts (tokens/s after the first; medians)",
         ["case", "theseus tok/s", "transformers tok/s", "transformers 1 thread tok/s", "theseus / faster transformers",
          "theseus first s", "transformers first s", "greedy tokens equal"], rows)
    if args.command_rounds:
        command = results["command"]
        show(f"`theseus.sample FOLDER --chat ... --temperature 0 --max-new-tokens {args.new_tokens}` vs a transformers "
             f"script (same reply: {command['same_reply']})", ["command", "seconds (median, min, max)", "peak MiB"],
             [(name, f"{v['seconds']['median']:.1f} ({v['seconds']['min']:.1f}, {v['seconds']['max']:.1f})",
               f"{v['peak_mib']['median']:.0f}") for name, v in command.items() if name != "same_reply"])
    save("generation", results)


if __name__ == "__main__":
    main()
