"""GRPO's rollout: a step's completions sampled on the training mesh with the params the step
starts from, scored by the reward functions, and laid out as the train step's examples.

    rollout = GRPORollout(task, layout, prompts)      # task.rollout(layout, prompts)
    batch, metrics = rollout.batch(params, loader, step)

Each step takes this process's prompts from the loader, repeats each ``num_generations`` times
(consecutive: a prompt's group) and samples every completion at once, each from its own key
(drawn from ``trainer.seed``, the step and the completion's place in the step: a resumed run
samples the same completions). Sampling runs on the mesh, with the params where they are,
through ``theseus.model.generate.complete`` (batched, a KV cache, stopping at the stop tokens).
Every process decodes and scores its own completions (``Rewards``); the scores are gathered so
that every process computes every advantage, each completion's from its own prompt's group,
found by the prompt's id (``theseus.tasks.grpo.advantages_by_prompt``), not by where the completion lies. Each
completion then carries its advantage through the placement on the mesh and the split into
micro-batches. With ``grpo.num_iterations`` above 1 the completions of a rollout are reused
for that many steps, against their log-probs when sampled (``old``); with ``grpo.beta`` the
reference's log-probs are computed once a rollout.

Evaluations sample one greedy completion of every validation prompt: ``val_reward`` (the mean
reward, the held-out accuracy of a 0/1 reward) and ``val_rewards/NAME/mean``; ``val_loss`` is
minus ``val_reward`` (what a sweep minimises, and what the best checkpoint is kept by).
"""

from __future__ import annotations

import base64
import functools
import io
import time
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

from theseus.base.axis import BATCH_MESH_AXES
from theseus.base.mesh import on_devices
from theseus.data.prompts import PROMPT, Prompts
from theseus.model.generate import complete
from theseus.model.lora import has_adapters, is_adapter
from theseus.model.sampling import Sampling
from theseus.tasks.task import LossTask, Rollout, StepLayout

SAMPLER = 0x6E9  # folded into trainer.seed: the sampler's keys, apart from dropout's
SHOWN = 4  # validation prompts shown at each evaluation


class GRPORollout(Rollout):
    """Completions of a step's prompts, sampled, scored and laid out (see the module)."""

    def __init__(self, task: LossTask, layout: StepLayout, prompts: Prompts):
        """``task``: the GRPO task (``theseus.tasks.grpo``), its settings, rewards and advantages."""
        self.task, self.layout, self.prompts = task, layout, prompts
        self.group = task.num_generations
        self.seq_len = layout.model.seq_len
        self.decode = prompts.tokenizer.as_hf()  # made once (byte's is built on each call)
        self.conversational = not isinstance(prompts.rows[prompts.split["train"][0]][PROMPT], str)
        self.rows_sharding = NamedSharding(layout.mesh, PartitionSpec(BATCH_MESH_AXES))
        self._score = jax.jit(functools.partial(_score, model=layout.model, task=task))
        self._start = None  # the reference's params (grpo.beta > 0, no LoRA adapters), read once
        self._reused: tuple[Any, dict[str, float]] | None = None  # the latest rollout (grpo.num_iterations > 1)
        self._samples: list[dict] = []

    @property
    def samples(self) -> list[dict]:
        return self._samples

    def batch(self, params: Any, loader: Any, step: int) -> tuple[Any, dict[str, float]]:
        """The step's examples: new completions every ``num_iterations`` steps, else the latest again."""
        if step % self.task.num_iterations and self._reused is not None:
            batch, metrics = self._reused
            return batch, {**metrics, "rollout_time": 0.0}
        jax.block_until_ready(params)  # the previous step's: its time is not the rollout's
        began = time.perf_counter()
        prompts = next(loader)  # this process's prompts
        rows = np.repeat(prompts, self.group)  # its completions' prompts: a group of each, consecutive
        groups = np.repeat(self.layout.share[0] * len(prompts) + np.arange(len(prompts)), self.group)  # prompt ids
        keys = jax.random.split(jax.random.fold_in(jax.random.fold_in(jax.random.key(self.layout.seed), SAMPLER),
                                                   step), self.layout.batch_size)
        tokens, lengths = self._sample(params, rows, keys, Sampling(self.task.temperature, self.task.top_k or None,
                                                                    self.task.top_p), self.group)
        every = self._everyone(self._scores(rows, tokens, lengths))  # every completion's, in the step's order
        totals = self.task.rewards.total(every)
        prompt_ids, all_lengths = self._everyone(groups), self._everyone(lengths)
        advantages, zero_std = self.task.advantages(totals, prompt_ids)
        items = float(all_lengths.sum()) / self.layout.grad_accum  # dapo's normaliser
        batch = self.layout.place(self._examples(rows, tokens, lengths, advantages[self._mine(len(rows))], items))
        if self.task.num_iterations > 1:
            batch["old"] = self._score(params, batch)
        if self.task.beta:
            batch["reference"] = self._reference(params, batch)
        metrics = self._metrics(every, totals, all_lengths, zero_std)
        metrics["rollout_time"] = time.perf_counter() - began
        self._reused = (batch, metrics) if self.task.num_iterations > 1 else None
        return batch, metrics

    def get_state(self) -> dict | None:
        """The completions being reused (``grpo.num_iterations > 1``): a checkpoint taken between
        their steps resumes with them (every process's, in an npz file's bytes, base64)."""
        if self._reused is None:
            return None
        batch, metrics = self._reused
        buffer = io.BytesIO()
        np.savez(buffer, **{key: _gathered(value) for key, value in batch.items()})
        return {"batch": base64.b64encode(buffer.getvalue()).decode("ascii"), "metrics": metrics}

    def set_state(self, state: dict | None) -> None:
        if state is None:
            self._reused = None
            return
        saved = np.load(io.BytesIO(base64.b64decode(state["batch"])), allow_pickle=False)
        index, count = self.layout.share
        mine = {key: np.split(saved[key], count, axis=1)[index].reshape(-1, *saved[key].shape[2:])
                for key in saved.files}  # this process's rows of each micro-batch, as it placed them
        self._reused = (self.layout.place(mine), state["metrics"])

    def evaluate(self, params: Any) -> dict[str, float]:
        """One greedy completion of every validation prompt (in batches of ``trainer.batch_size``),
        scored: ``val_reward``, ``val_rewards/NAME/mean`` and ``val_loss`` (minus ``val_reward``)."""
        rows = np.asarray(self.prompts.fitting("val", self.seq_len), np.int32)
        size, (index, count) = self.layout.batch_size, self.layout.share
        scores, shown = [], []
        for start in range(0, len(rows), size):
            held = rows[start:start + size]
            padded = np.resize(held, size)  # the last batch filled with prompts again, then left out
            mine = padded[index * size // count:(index + 1) * size // count]
            keys = jax.random.split(jax.random.key(0), size)
            tokens, lengths = self._sample(params, mine, keys, Sampling(0.0))
            scores.append(self._everyone(self._scores(mine, tokens, lengths))[:len(held)])
            if not shown and index == 0:  # the first prompts, shown by process 0
                shown = self._shown(mine[:SHOWN], tokens[:SHOWN], lengths[:SHOWN], scores[-1][:SHOWN])
        every = np.concatenate(scores)
        totals = self.task.rewards.total(every)
        self._samples = shown
        reward = float(np.nanmean(totals)) if not np.isnan(totals).all() else float("nan")
        metrics = {"val_loss": -reward, "val_reward": reward}
        for name, column in zip(self.task.rewards.names, every.T):
            metrics[f"val_rewards/{name}/mean"] = float(np.nanmean(column)) if not np.isnan(column).all() else np.nan
        return metrics

    def _sample(self, params: Any, rows: np.ndarray, keys: jax.Array, sampling: Sampling,
                group: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens int32 [n, max_completion_length], lengths int32 [n])``: this process's completions
        of the prompts ``rows`` (``n`` of them, the process's share of every process's; in runs of
        ``group`` copies of a prompt, each run prefilled once), sampled on the mesh with ``keys``
        (every process's), 0 after each completion's stop token."""
        count = self.layout.share[1]
        width = self.seq_len + 1 - self.task.max_completion_length  # the longest prompt that fits
        prompts = np.zeros((len(rows), width), np.int32)
        lengths = np.asarray([len(self.prompts.ids[row]) for row in rows], np.int32)
        for i, row in enumerate(rows):
            prompts[i, :lengths[i]] = self.prompts.ids[row]
        total = len(rows) * count
        with jax.set_mesh(self.layout.mesh), nn.logical_axis_rules(self.layout.rules):
            out = complete(self.layout.model, params, on_devices(prompts, self.rows_sharding, (total, width)),
                           on_devices(lengths, self.rows_sharding, (total,)), self.task.max_completion_length,
                           sampling, keys=keys, stop_tokens=self.prompts.stop_tokens,
                           vocab_size=self.prompts.vocab_size, group=group)
        return _gathered(out.tokens)[self._mine(len(rows))], _gathered(out.lengths)[self._mine(len(rows))]

    def _scores(self, rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """float32 ``[n, functions]``: the reward functions' scores of these completions."""
        ids = [tokens[i, :lengths[i]].tolist() for i in range(len(rows))]
        texts = self.decode.decode_batch(ids, skip_special_tokens=True)
        completions = [[{"role": "assistant", "content": text}] for text in texts] if self.conversational else texts
        prompts = [self.prompts.rows[row][PROMPT] for row in rows]
        return self.task.rewards.score(prompts, completions, ids, self.prompts.columns(rows))

    def _examples(self, rows: np.ndarray, tokens: np.ndarray, lengths: np.ndarray, advantages: np.ndarray,
                  items: float) -> dict[str, np.ndarray]:
        """This process's examples (``task.example``'s, less the log-probs), ``[n, ...]``."""
        window = np.zeros((len(rows), self.seq_len + 1), np.int32)
        prompt_lengths = np.zeros(len(rows), np.int32)
        for i, row in enumerate(rows):
            ids = self.prompts.ids[row]
            prompt_lengths[i] = len(ids)
            window[i, :len(ids)] = ids
            window[i, len(ids):len(ids) + lengths[i]] = tokens[i, :lengths[i]]
        return {"tokens": window, "prompt": prompt_lengths, "completion": lengths.astype(np.int32),
                "advantage": advantages.astype(np.float32), "items": np.full(len(rows), items, np.float32)}

    def _metrics(self, scores: np.ndarray, totals: np.ndarray, lengths: np.ndarray,
                 zero_std: float) -> dict[str, float]:
        """TRL's: ``reward`` and ``reward_std`` (of the weighted sums, unscorable left out),
        ``rewards/NAME/mean`` and ``/std``, ``frac_reward_zero_std`` (``zero_std``: the share of
        completions whose group's rewards, or the batch's, all agree), ``completion_length`` (mean
        tokens, the stop token included) and ``completions/clipped_ratio`` (the share that reached
        ``max_completion_length`` without stopping)."""
        metrics = {"reward": _nan_mean(totals), "reward_std": _nan_std(totals),
                   "frac_reward_zero_std": zero_std,
                   "completion_length": float(np.mean(lengths)),
                   "completions/clipped_ratio": float(np.mean(lengths >= self.task.max_completion_length))}
        for name, column in zip(self.task.rewards.names, scores.T):
            metrics[f"rewards/{name}/mean"], metrics[f"rewards/{name}/std"] = _nan_mean(column), _nan_std(column)
        return metrics

    def _reference(self, params: Any, batch: dict[str, jax.Array]) -> jax.Array:
        """The reference's log-probs of ``batch``: ``params`` with their LoRA adapters off (the
        base, no copy of it), else the run's start (its weights read once, kept on the mesh)."""
        if has_adapters(params):
            return self._score(adapters_off(params), batch)
        if self._start is None:
            self._start = self.layout.start()
        return self._score(self._start, batch)

    def _mine(self, n: int) -> slice:
        """This process's ``n`` rows within a step's (its share's)."""
        index = self.layout.share[0]
        return slice(index * n, (index + 1) * n)

    def _everyone(self, local: np.ndarray) -> np.ndarray:
        """Every process's rows of ``local`` (this process's share of a step's rows), in the step's order."""
        count = self.layout.share[1]
        return _gathered(on_devices(local, self.rows_sharding, (len(local) * count, *local.shape[1:])))

    def _shown(self, rows: Sequence[int], tokens: np.ndarray, lengths: np.ndarray,
               scores: np.ndarray) -> list[dict]:
        texts = self.decode.decode_batch([tokens[i, :lengths[i]].tolist() for i in range(len(rows))],
                                         skip_special_tokens=True)
        return [{"prompt": self.prompts.rows[row][PROMPT], "completion": text,
                 **{name: (None if np.isnan(value) else float(value)) for name, value in zip(self.task.rewards.names, row_scores)}}
                for row, text, row_scores in zip(rows, texts, scores)]


def _score(params: Any, batch: dict[str, jax.Array], *, model: nn.Module, task: LossTask) -> jax.Array:
    """float32 ``[grad_accum, micro, max_completion_length]``: the log-probs of a step's completions
    under ``params``, a micro-batch at a time (as the step holds them)."""
    return jax.lax.map(lambda micro: task.logps(model, params, micro)[0], batch)


def adapters_off(params: Any) -> Any:
    """``params`` with every LoRA adapter zeroed: the base model's computation (B = 0)."""
    return jax.tree_util.tree_map_with_path(lambda path, x: jnp.zeros_like(x) if is_adapter(path) else x, params)


def _gathered(x: Any) -> np.ndarray:
    """Every process's ``x`` (this process's rows of a global array, or a host array of its own),
    concatenated in process order."""
    if jax.process_count() == 1:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def _nan_mean(x: np.ndarray) -> float:
    return float(np.nanmean(x)) if not np.isnan(x).all() else float("nan")


def _nan_std(x: np.ndarray) -> float:
    """The sample std of ``x``'s non-NaN values (TRL's ``nanstd``), NaN for fewer than two."""
    kept = x[~np.isnan(x)]
    return float(np.std(kept, ddof=1)) if len(kept) > 1 else float("nan")
