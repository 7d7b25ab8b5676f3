"""lm-evaluation-harness on a theseus model: its task zoo, scored on the run's mesh.

    lm = HarnessLM(model, params, tokenizer, mesh, rules, batch_size=16)
    manager = task_manager(["hellaswag", "my_local_task"], include="tasks/")  # checks the names
    metrics, samples, results = run_tasks(lm, ["hellaswag", "my_local_task"], manager)
    # {"eval/hellaswag/acc": ..., "eval/hellaswag/acc_stderr": ..., ...}, {"hellaswag": [per-example records]}
    write_results(results, Path("results/"), "outputs/run")  # lm-eval's own files, as lm_eval --output_path

``HarnessLM`` is an ``lm_eval.api.model.TemplateLM``: lm-eval encodes each request itself (its
whitespace and BOS conventions, through theseus's tokenizer), and theseus scores the tokens:
``loglikelihood`` and ``loglikelihood_rolling`` as batches of rows sorted by length, each batch
padded to a power of two (few compiled shapes) and split over the mesh's batch axes;
``generate_until`` by theseus's KV-cache generation, greedy or sampled, cut at the first stop
sequence. In a multi-process job every process runs lm-eval on every request, alike: each puts
its share of a batch's rows on its devices, and every process reads back all the rows' results,
so every process computes the same numbers. lm-eval is an optional dependency
(``theseus[eval]``): importing this module without it raises a ConfigError saying what to
install, so import it lazily, where tasks are asked for.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import yaml
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from theseus.base.axis import BATCH_MESH_AXES
from theseus.base.mesh import on_devices
from theseus.base.native_output import native_lines_filtered
from theseus.config import ConfigError
from theseus.data.tokenizer import Tokenizer
from theseus.evaluation.multiple_choice import encode_text, log_likelihoods
from theseus.model.generate import complete
from theseus.model.sampling import Sampling

try:
    from lm_eval import simple_evaluate
    from lm_eval.api.model import TemplateLM
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager, get_task_dict
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
except ImportError as exc:
    raise ConfigError("lm-evaluation-harness is not installed: pip install 'theseus[eval]' (or lm-eval)") from exc


class DefaultsTaken(logging.Filter):
    """Drops lm-eval's warning that a task YAML's metric takes its default ``aggregation`` or
    ``higher_is_better`` (its registry's, as documented: a task of one's own lists ``metric: acc``
    alone), said again each time the task is loaded; its other warnings pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (" is defined, but " in message and "using default" in message)


logging.getLogger("lm_eval.api.task").addFilter(DefaultsTaken())  # once: this module is imported once


def is_git_noise(line: bytes) -> bool:
    """``fatal: not a git repository ...``: lm-eval asks ``git describe`` for the commit it
    records, wherever it runs, and git says it on stderr outside a repository."""
    return line.startswith(b"fatal: not a git repository")


class HarnessLM(TemplateLM):
    """A theseus causal LM (``model``, its ``params`` laid out on ``mesh``) as lm-eval's model.

    ``rules``: the model's logical-axis rules; ``batch_size``: rows per forward (a multiple of
    the mesh's batch axes); ``vocab_size``: the ids scored and generated (the vocabulary an export
    keeps; None: the model's); ``seed``: of sampled generations; ``share``: ``(index, count)``,
    this process puts rows ``index * batch_size / count`` to ``(index + 1) * batch_size / count`` of
    each batch of log-likelihood rows on its devices (the trainer's share of a batch).
    """

    def __init__(self, model: nn.Module, params: Any, tokenizer: Tokenizer, mesh: Mesh, rules: Any,
                 batch_size: int, vocab_size: int | None = None, seed: int = 0, share: tuple[int, int] = (0, 1)):
        super().__init__()
        self.model, self.params, self.tokenizer, self.mesh, self.rules = model, params, tokenizer, mesh, rules
        self.batch_size, self.seed, self.share = batch_size, seed, share
        self.vocab_size = model.vocab_size if vocab_size is None else vocab_size
        self.sharding = NamedSharding(mesh, PartitionSpec(BATCH_MESH_AXES, None, None))
        self._score = jax.jit(functools.partial(log_likelihoods, model=model, vocab_size=self.vocab_size))

    @property
    def eot_token_id(self) -> int:
        if self.tokenizer.eot is None:
            raise ConfigError("this tokenizer has no end-of-text token, which lm-eval needs to stop generations and "
                              "to begin empty contexts: train with data.tokenizer=byte or bpe")
        return self.tokenizer.eot

    @property
    def prefix_token_id(self) -> int:
        prefix = self.tokenizer.prefix_token
        return self.eot_token_id if prefix is None else prefix

    @property
    def max_length(self) -> int:
        return self.model.seq_len

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """``string``'s ids, with the tokenizer's special tokens as ``add_special_tokens`` says (None:
        as lm-eval's hf model does, unless ``string`` begins with the BOS's text already)."""
        if add_special_tokens is None:
            return encode_text(self.tokenizer, string)
        return self.tokenizer.encode(string, special=add_special_tokens)

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``(summed log-likelihood, greedy)`` of each ``(key, context ids, continuation ids)``: the
        row ``context + continuation`` keeps its last ``seq_len + 1`` tokens (cut on the left, as
        lm-eval does) and its last ``len(continuation)`` targets are scored."""
        rows = [(ctx + cont)[-(self.max_length + 1):] for _, ctx, cont in requests]
        scored = [min(len(cont), len(row) - 1) for (_, _, cont), row in zip(requests, rows)]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # longest first: batches of like widths
        out: list[tuple[float, bool]] = [(0.0, False)] * len(rows)
        index, count = self.share
        mine = slice(index * self.batch_size // count, (index + 1) * self.batch_size // count)
        for first in range(0, len(order), self.batch_size):
            batch = order[first:first + self.batch_size]
            width = min(self.max_length + 1, 1 << (len(rows[batch[0]]) - 1).bit_length())
            tokens = np.zeros((self.batch_size, 1, width), np.int32)
            mask = np.zeros((self.batch_size, 1, width - 1), np.float32)
            for slot, i in enumerate(batch):
                tokens[slot, 0, :len(rows[i])] = rows[i]
                mask[slot, 0, len(rows[i]) - 1 - scored[i]:len(rows[i]) - 1] = 1
            with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
                # the scores come back replicated: every process reads every row's
                summed, greedy = self._score(self.params, *(on_devices(x[mine], self.sharding, x.shape)
                                                            for x in (tokens, mask)))
            summed, greedy = np.asarray(summed)[:, 0], np.asarray(greedy)[:, 0]
            for slot, i in enumerate(batch):
                out[i] = (float(summed[slot]), bool(greedy[slot]))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Each document's summed log-likelihood over disjoint windows of ``seq_len`` tokens, the
        first conditioned on ``prefix_token_id`` (lm-eval's perplexity tasks)."""
        windows, owners = [], []
        for index, (text,) in enumerate(request.args for request in requests):
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, continuation))
                owners.append(index)
        totals = np.zeros(len(requests))
        for owner, (logp, _) in zip(owners, self._loglikelihood_tokens(windows)):
            totals[owner] += logp
        return totals.tolist()

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Each ``(context, {"until": [...], "max_gen_toks": N, "do_sample": ..., "temperature": ...})``
        continued greedily (or sampled when ``do_sample``) and cut before the first stop sequence.

        Requests of the same ``max_gen_toks`` and temperature run ``batch_size`` at a time, longest
        context first; each row is what it would be alone (its draws seeded by its index). The
        first ``min(N, seq_len - 1)`` tokens follow the context's last ``seq_len - N`` tokens, as
        lm-eval's hf model generates; past the window, generation goes on in steps of
        ``seq_len // 2`` tokens, each conditioned on the last ``seq_len / 2`` tokens so far.
        """
        groups: dict[tuple[int, float], list[tuple[int, list[int], list[str]]]] = {}
        for index, request in enumerate(requests):
            context, settings = request.args
            settings = dict(settings)
            until = settings.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            if self.tokenizer.eot is not None:
                until.append(self.tokenizer.decode([self.tokenizer.eot]))
            budget = max(1, int(settings.pop("max_gen_toks", 256)))
            temperature = float(settings.pop("temperature", 1.0)) if settings.pop("do_sample", False) else 0.0
            ids = self.tok_encode(context) or [self.prefix_token_id]
            groups.setdefault((budget, temperature), []).append((index, ids, [stop for stop in until if stop]))
        out = [""] * len(requests)
        for (budget, temperature), rows in groups.items():
            rows.sort(key=lambda row: -len(row[1]))
            for first in range(0, len(rows), self.batch_size):
                batch = rows[first:first + self.batch_size]
                for (index, _, until), text in zip(batch, self._continue(batch, budget, temperature)):
                    out[index] = min((text.split(stop)[0] for stop in until), key=len, default=text)
        return out

    def _continue(self, rows: list[tuple[int, list[int], list[str]]], budget: int, temperature: float) -> list[str]:
        """The text each ``(index, context ids, stop sequences)`` of ``rows`` continues with, in
        steps (see ``generate_until``) until ``budget`` tokens or one of its stop sequences. A
        row ends early at the end-of-text token when that token's text is one of its stop
        sequences (the text is cut there anyway)."""
        produced: list[list[int]] = [[] for _ in rows]
        texts = [""] * len(rows)
        live = list(range(len(rows)))
        eot = self.tokenizer.eot
        stop_tokens = [eot] if eot is not None and self.tokenizer.decode([eot]) else []
        while live:
            done = len(produced[live[0]])  # rows move in lockstep: every live row has made as many
            step = min(budget - done, self.max_length - 1 if not done else self.max_length // 2)
            prompts = [(rows[i][1] + produced[i])[-(self.max_length - step):] for i in live]
            slots = live + [live[0]] * (self.batch_size - len(live))  # a full batch: one compiled shape
            prompts += [prompts[0]] * (len(slots) - len(live))
            tokens = np.zeros((len(slots), max(map(len, prompts))), np.int32)
            for slot, prompt in enumerate(prompts):
                tokens[slot, :len(prompt)] = prompt
            rngs = jnp.stack([jax.random.fold_in(jax.random.fold_in(jax.random.key(self.seed), rows[i][0]), done)
                              for i in slots])
            with jax.set_mesh(self.mesh), nn.logical_axis_rules(self.rules):
                # every process passes the same prompts; the rows come back split over the
                # batch axes, on other processes' devices too: gathered onto every process
                out = complete(self.model, self.params, tokens, [len(p) for p in prompts], step, Sampling(temperature),
                               keys=rngs, stop_tokens=stop_tokens, vocab_size=self.vocab_size)
                new, lengths = multihost_utils.process_allgather((out.tokens, out.lengths), tiled=True)
            for slot, i in enumerate(live):
                produced[i] += new[slot, :lengths[slot]].tolist()
                # ids past the tokenizer's (a checkpoint's vocabulary may be larger) decode to
                # nothing, as Hugging Face's tokenizers decode them
                texts[i] = self.tokenizer.decode([token for token in produced[i] if token < self.tokenizer.vocab_size])
            live = [i for i in live if len(produced[i]) < budget and not any(stop in texts[i] for stop in rows[i][2])]
        return texts


def task_manager(tasks: list[str], include: str | None = None) -> TaskManager:
    """lm-eval's index of its own tasks and of the task YAMLs under ``include``; ConfigError
    naming the first of ``tasks`` that it does not hold, or whose data does not load (a hub
    dataset offline, a task YAML's missing file): before any training, not at its first evaluation."""
    manager = TaskManager(include_path=include)
    unknown = [task for task in tasks if task not in manager.all_tasks]
    if unknown:
        broken = unreadable_task_file(include, unknown[0]) if include else None
        if broken:
            raise ConfigError(f"{broken}: lm-eval skips it, so task {unknown[0]!r} is unknown: fix the file")
        where = f" or of a task YAML under {include}" if include else " (local task YAMLs: give an include path)"
        raise ConfigError(f"unknown lm-eval task {unknown[0]!r}: give the name of one of lm-eval's tasks{where}")
    for task in tasks:
        try:
            get_task_dict([task], manager)  # loads its data (datasets caches it for the evaluations)
        except OSError as exc:  # ConnectionError (the hub), FileNotFoundError (a data file)
            raise ConfigError(f"evaluation.lm_eval task {task!r}: its data does not load ({' '.join(str(exc).split())}): "
                              f"run once where its dataset is reachable (cached after), or give a task YAML whose "
                              f"data files exist (evaluation.lm_eval_include)") from None
    return manager


class _AnyTags(yaml.SafeLoader):
    """YAML with its tags read as plain values (a task YAML's ``!function module.name``)."""


_AnyTags.add_multi_constructor("!", lambda loader, suffix, node: None)


def unreadable_task_file(include: str, task: str) -> str | None:
    """Why a task YAML under ``include`` does not load (lm-eval's index skips such a file without a
    word): the file named ``task`` first, else the first that does not; None when every one loads."""
    for path in sorted(Path(include).expanduser().rglob("*.yaml"), key=lambda path: (path.stem != task, path)):
        try:
            node = yaml.load(path.read_text(encoding="utf-8"), Loader=_AnyTags)  # noqa: S506 - a SafeLoader
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f"line {mark.line + 1}: " if mark is not None else ""
            return f"{path} does not parse as YAML ({line}{getattr(exc, 'problem', None) or 'unreadable'})"
        if not isinstance(node, dict):
            return f"{path} holds {type(node).__name__}, not a task's mapping (task: NAME, dataset_path: ...)"
    return None


def run_tasks(lm: HarnessLM, tasks: list[str], manager: TaskManager, num_fewshot: int | None = None,
              limit: int | None = None) -> tuple[dict[str, float], dict[str, list[dict]], dict]:
    """``(metrics, samples, results)`` of lm-eval's ``tasks`` (names ``manager`` holds) on ``lm``:
    ``eval/TASK/METRIC`` (lm-eval's ``acc,none`` is ``acc``, another filter ``METRIC/FILTER``),
    each task's per-example records, and lm-eval's own results (its ``samples`` included), for
    ``write_results``."""
    with native_lines_filtered(is_git_noise):
        results = simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, num_fewshot=num_fewshot,
                                  limit=limit, log_samples=True)
    metrics = {}
    for task, values in results["results"].items():
        for key, value in values.items():
            metric, _, kept = key.partition(",")
            if kept and isinstance(value, (int, float)) and not isinstance(value, bool):
                name = metric if kept == "none" else f"{metric}/{kept}"
                metrics[f"eval/{task}/{name}"] = float(value)
    samples = {task: [_sample(record) for record in records] for task, records in results["samples"].items()}
    return metrics, samples, {**results, **tokenizer_info(lm)}


def tokenizer_info(lm: HarnessLM) -> dict[str, Any]:
    """What lm-eval records of an hf model's tokenizer (its ``add_tokenizer_info``, which reads
    Hugging Face tokenizers' attributes) for ``lm``'s: the end-of-text token as EOS (and padding,
    as lm-eval pads an hf tokenizer without one), the BOS it adds (if any), ``[text, str(id)]``."""
    def token(i: int | None) -> list[str | None]:
        return [None if i is None else lm.tokenizer.as_hf().id_to_token(i), str(i)]

    bos = lm.tokenizer.encode("", special=True)
    return {"tokenizer_pad_token": token(lm.tokenizer.eot), "tokenizer_eos_token": token(lm.tokenizer.eot),
            "tokenizer_bos_token": token(bos[0] if bos else None), "eot_token_id": lm.tokenizer.eot,
            "max_length": lm.max_length}


def write_results(results: dict, output_path: Path, model: str) -> Path:
    """lm-eval's own files of ``results`` (``run_tasks``'s), written by lm-eval's
    ``EvaluationTracker`` where ``lm_eval --output_path`` puts them: for a path ending in
    ``.json``, ``STEM_DATE.json`` beside it, else ``OUTPUT_PATH/MODEL/results_DATE.json`` (MODEL:
    ``model`` as lm-eval's ``pretrained=`` names it); each task's samples in that folder as
    ``samples_TASK_DATE.jsonl``. Returns the results file."""
    rest = {key: value for key, value in results.items() if key != "samples"}
    tracker = EvaluationTracker(output_path=str(output_path))
    general = tracker.general_config_tracker
    general.start_time -= time.time() - results["date"]  # the evaluation's duration, not the writing's
    general.log_experiment_args(model_source="theseus", model_args={"pretrained": model}, system_instruction=None,
                                chat_template=None, fewshot_as_multiturn=False)
    tracker.save_results_aggregated(results=rest, samples=results["samples"])
    for task in rest["configs"]:
        tracker.save_results_samples(task_name=task, samples=results["samples"][task])
    folder = output_path.parent if output_path.suffix == ".json" else output_path / general.model_name_sanitized
    return next(folder.glob(f"*_{tracker.date_id}.json"))


def _sample(record: dict) -> dict:
    """The JSON-able part of one of lm-eval's per-example records: its index, target, responses
    and metrics."""
    kept = {"index": record["doc_id"], "target": record.get("target"),
            "responses": record.get("filtered_resps", record.get("resps"))}
    kept.update({key: record[key] for key in record.get("metrics", []) if key in record})
    return jax.tree.map(lambda x: x.item() if isinstance(x, np.generic) else x, kept)
