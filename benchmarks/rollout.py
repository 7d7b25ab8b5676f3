"""GRPO's rollout: completion tokens/s of theseus's sampling as a ``task=grpo`` step runs it, against
transformers' ``generate`` on the same model, batch and lengths; and the rollout's share of a
GRPO step.

    python benchmarks/rollout.py [--layers 4] [--prompts 8] [--generations 8] [--new-tokens 64] [--rounds 3]

The model: SmolLM2-135M's shape (Llama: d_model 576, 9 heads, 3 kv heads, d_ff 1536, tied
embeddings; ``--layers`` of its 30, vocabulary 512) with random weights, saved as a Hugging Face
folder here (nothing downloaded); prompts of 32 bytes (theseus's byte tokenizer: the same ids
on both sides). Both sides compute in float32 on the CPU at their default threads.

Sampling: a GRPO run's batch (``--prompts`` x ``--generations`` completions) from the run's own
rollout (``GRPORollout._sample``: the prompts laid on the mesh, ``complete`` with one prefill a
prompt for its generations, the completions fetched), greedy and sampled (TRL's temperature
1.0), ``--new-tokens`` each (no stop token: every row makes them all), against ``generate``
with ``min_new_tokens`` equal; the sides alternate (A B B A ...) ``--rounds`` times; tokens/s
is the batch's completion tokens over the call's seconds, and the ratio is of medians. The
share: ``--steps`` steps of the run's trainer loop parts (``rollout.batch``, then the compiled
train step), the rollout's seconds over the step's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from common import interleaved, make_run, save, show, spread

SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
           "max_position_embeddings": 8192, "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": True}
PROMPT = 32  # bytes a prompt
REWARD = "def zero(prompts, completions, completion_ids, **kwargs):\n    return [0.0] * len(prompts)\n"


def folder_of(base: Path, layers: int) -> Path:
    """A random Llama of SmolLM2-135M's width, ``layers`` deep, vocabulary 512 (bytes fit), saved."""
    import torch
    import transformers

    config = transformers.LlamaConfig(**SMOLLM2, vocab_size=512, num_hidden_layers=layers, bos_token_id=None,
                                      eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(base / "model")
    return base / "model"


def grpo_run(base: Path, folder: Path, prompts: int, generations: int, new: int):
    """A ``task=grpo`` run of ``folder``, assembled: ``prompts`` x ``generations`` completions a step."""
    rows = ["".join(chr(97 + (i * 7 + j) % 26) for j in range(PROMPT)) for i in range(64)]
    (base / "prompts.jsonl").write_text("".join(json.dumps({"prompt": row}) + "\n" for row in rows))
    (base / "bench_rewards.py").write_text(REWARD)
    import sys

    sys.path.insert(0, str(base))
    return make_run(["task=grpo", f"trainer.init_from={folder}", "data.source=jsonl",
                     f"data.path={base / 'prompts.jsonl'}", "data.tokenizer=byte", "grpo.reward=bench_rewards:zero",
                     f"grpo.num_generations={generations}", f"grpo.max_completion_length={new}",
                     f"trainer.batch_size={prompts * generations}", f"architecture.seq_len={PROMPT + new}",
                     "architecture.dtype.activation=float32", "optimizer.warmup_steps=0", "trainer.max_steps=100",
                     "mesh.cpu_devices=1"])


def sampling_sides(run, folder: Path, prompts: int, generations: int, new: int, temperature: float) -> dict:
    """theseus's rollout sampling and transformers' ``generate`` of one step's completions."""
    import torch
    import transformers

    from theseus.model.sampling import Sampling

    rollout, params = run.rollout, run.start(run.compiled, lambda text: None)[0].params
    rows = np.repeat(np.arange(prompts, dtype=np.int32), generations)
    keys = jax.random.split(jax.random.key(0), len(rows))
    sampling = Sampling(temperature)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    ids = torch.tensor(np.stack([rollout.prompts.ids[row] for row in rows]).astype(np.int64))
    extra = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {
        "do_sample": False}

    def ours() -> float:
        began = time.perf_counter()
        tokens, _ = rollout._sample(params, rows, keys, sampling, rollout.group)
        assert tokens.shape == (len(rows), new)
        return time.perf_counter() - began

    def theirs() -> float:
        began = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, **extra)
        assert out.shape == (len(rows), PROMPT + new)
        return time.perf_counter() - began

    return {"theseus": ours, "transformers": theirs}


def step_share(run, steps: int) -> dict[str, float]:
    """Seconds of ``steps`` GRPO steps (after one to compile), split into the rollout and the train step."""
    s = run.settings.trainer
    state = run.start(run.compiled, lambda text: None)[0]
    loader = run.dataset.loader("train", run.model.seq_len, s.batch_size, seed=0)
    key = jax.random.key(1)
    rollout_s, step_s = [], []
    for step in range(steps + 1):
        began = time.perf_counter()
        batch, _ = run.rollout.batch(state.params, loader, step)
        made = time.perf_counter()
        state, metrics = run.compiled.step(state, batch, key)
        jax.block_until_ready(metrics["loss"])
        if step:  # the first compiles
            rollout_s.append(made - began)
            step_s.append(time.perf_counter() - began)
    return {"rollout_s": statistics.median(rollout_s), "step_s": statistics.median(step_s),
            "share": statistics.median(r / t for r, t in zip(rollout_s, step_s))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4, help="of SmolLM2-135M's 30")
    parser.add_argument("--prompts", type=int, default=8, help="prompts a step")
    parser.add_argument("--generations", type=int, default=8, help="completions a prompt")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens a completion")
    parser.add_argument("--rounds", type=int, default=3, help="measurements of each side")
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps timed for the share")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        folder = folder_of(base, args.layers)
        run = grpo_run(base, folder, args.prompts, args.generations, args.new_tokens)
        completions = args.prompts * args.generations
        rows, results = [], {"sampling": {}}
        for mode, temperature in (("greedy", 0.0), ("sampled", 1.0)):
            sides = sampling_sides(run, folder, args.prompts, args.generations, args.new_tokens, temperature)
            for side in sides.values():
                side()  # warm-up: compile, first allocations
            seconds = interleaved(sides, args.rounds)
            rates = {name: completions * args.new_tokens / statistics.median(values) for name, values in seconds.items()}
            results["sampling"][mode] = {name: {"tokens_per_s": rates[name], "seconds": spread(values)}
                                         for name, values in seconds.items()}
            results["sampling"][mode]["ratio"] = rates["theseus"] / rates["transformers"]
            rows.append([mode, f"{completions} x {args.new_tokens}", f"{rates['theseus']:.0f}",
                         f"{rates['transformers']:.0f}", f"{rates['theseus'] / rates['transformers']:.2f}"])
        show("GRPO rollout sampling: completion tokens/s", ["mode", "batch x tokens", "theseus", "transformers",
                                                             "ratio"], rows)
        share = step_share(run, args.steps)
        results["step"] = share
        show("a GRPO step", ["rollout s", "step s", "rollout share"],
             [[f"{share['rollout_s']:.3f}", f"{share['step_s']:.3f}", f"{share['share']:.0%}"]])
    save("rollout", {"settings": vars(args), **results})


if __name__ == "__main__":
    main()
