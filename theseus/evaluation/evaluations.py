"""What each evaluation measures: the validation loss (overall and per mixture source), the
multiple-choice tasks of ``evaluation.multiple_choice`` and the lm-evaluation-harness tasks of
``evaluation.lm_eval`` (``eval/TASK/METRIC`` as lm-eval names its metrics).

    evaluations = load_evaluations(settings, data, model, seed=0, prefetch=0)   # checks every file first
    metrics = evaluate(params, evaluations, loss=..., sharding=..., rules=..., share=(0, 1),
                       batch_size=16, batches=10)
    # {"val_loss": ..., "val_bpb": ..., "val_loss/NAME": ..., "val_bpb/NAME": ...,
    #  "eval/TASK/acc": ..., "eval/TASK/acc_stderr": ..., "eval/TASK/acc_norm": ..., "eval/TASK/acc_bytes": ...}
    evaluations.samples["TASK"]  # the latest evaluation's per-example records

The training loop and ``python -m theseus.evaluate`` (a saved checkpoint) call the same
``evaluate``. The overall ``val_loss`` of a mixture is the weighted mean of its sources' losses
(the expected loss of a draw from the mixture); each source's is computed on that source's own
validation batches, exactly those a run on that source alone evaluates on.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import flax.linen as nn
import jax
from jax.sharding import NamedSharding, PartitionSpec

from theseus.base.axis import LogicalRules
from theseus.base.dispatch import fetched
from theseus.base.mesh import on_devices
from theseus.config import ConfigError, Configurable, field
from theseus.data.dataset_protocol import Dataset, WholeValidation
from theseus.data.mixture import Mixture
from theseus.data.tokenizer import Tokenizer
from theseus.evaluation.multiple_choice import Examples, accuracy, load_examples, log_likelihoods, per_example, score


@dataclasses.dataclass(frozen=True)
class EvaluationConfig(Configurable):
    RESUMABLE: ClassVar[bool] = True  # every key may change on resuming: none alters the numbers

    multiple_choice: dict = field("evaluation.multiple_choice", default={},
                                  help='NAME: PATH of a JSONL file of {"context", "choices", "label"}, scored at each '
                                       "evaluation (eval/NAME/acc, acc_norm, acc_bytes and their _stderr)")
    lm_eval: list = field("evaluation.lm_eval", default=[],
                          help="lm-evaluation-harness task names run at each evaluation (eval/TASK/METRIC); "
                               "needs theseus[eval]")
    lm_eval_include: str | None = field("evaluation.lm_eval_include", default=None,
                                        help="a folder (or file) of local lm-eval task YAMLs, beside lm-eval's own")
    lm_eval_fewshot: int | None = field("evaluation.lm_eval_fewshot", default=None,
                                        help="few-shot examples per lm-eval request (None: each task's own)")
    lm_eval_limit: int | None = field("evaluation.lm_eval_limit", default=None,
                                      help="at most this many examples of each lm-eval task (None: all)")

    def __post_init__(self):
        for name, path in self.multiple_choice.items():
            key = f"evaluation.multiple_choice.{name}"
            if not isinstance(path, str) or not path:
                raise ConfigError(f"{key} must be the path of a JSONL file, got {path!r}")
            if not os.path.isfile(os.path.expanduser(path)):
                raise ConfigError(f"{key}={path}: no such file; give a JSONL file of "
                                  '{"context", "choices", "label"} lines')
        if not all(isinstance(task, str) and task for task in self.lm_eval):
            raise ConfigError(f"evaluation.lm_eval must be a list of lm-eval task names, got {list(self.lm_eval)!r}")
        if self.lm_eval_include is not None and not os.path.exists(os.path.expanduser(self.lm_eval_include)):
            raise ConfigError(f"evaluation.lm_eval_include={self.lm_eval_include}: no such file or folder; give "
                              "a folder of lm-eval task YAMLs")
        if self.lm_eval_fewshot is not None and self.lm_eval_fewshot < 0:
            raise ConfigError(f"evaluation.lm_eval_fewshot must be 0 or more, got {self.lm_eval_fewshot}")
        if self.lm_eval_limit is not None and self.lm_eval_limit < 1:
            raise ConfigError(f"evaluation.lm_eval_limit must be positive, got {self.lm_eval_limit}")


@dataclasses.dataclass(frozen=True)
class Evaluations:
    """A run's evaluation sets, loaded once: validation sources (NAME -> dataset, weight; ``data``
    alone for a single corpus), multiple-choice tasks (NAME -> examples) and lm-eval's."""

    sources: dict[str, tuple[Dataset, float]]
    tasks: dict[str, Examples]
    score_fn: Callable  # jitted log_likelihoods: (params, tokens, mask) -> [batch, choices]
    seq_len: int
    seed: int
    prefetch: int
    bytes_per_token: float | None  # of the whole (mixed) corpus
    mixed: bool  # a mixture: each source's loss is logged too
    model: nn.Module
    tokenizer: Tokenizer
    vocab_size: int  # the ids scored: the tokenizer's, or an imported checkpoint's own (what an export keeps)
    harness: EvaluationConfig | None = None  # the lm-eval settings, when evaluation.lm_eval names tasks
    manager: Any = None  # lm-eval's TaskManager of those tasks (lm-eval's and those of lm_eval_include)
    samples: dict[str, list[dict]] = dataclasses.field(default_factory=dict)  # TASK -> the latest per-example records
    harness_results: dict = dataclasses.field(default_factory=dict)  # lm-eval's own, of the latest (write_results)


def load_evaluations(settings: EvaluationConfig, data: Dataset, model: nn.Module, seed: int, prefetch: int,
                     imported: bool = False) -> Evaluations:
    """The evaluations ``settings`` ask for on ``data``; ConfigError, naming the file and line,
    for a multiple-choice file that does not load. ``imported``: the model's weights come from
    a Hugging Face folder, whose vocabulary is its own."""
    sources = ({name: (data.sources[name], weight) for name, weight in data.weights.items()}
               if isinstance(data, Mixture) else {"data": (data, 1.0)})
    tasks = {str(name): load_examples(path, data.tokenizer, model.seq_len)
             for name, path in settings.multiple_choice.items()}
    # an imported checkpoint keeps its vocabulary; a run's own drops the rows padding its tokenizer's
    vocab_size = model.vocab_size if imported else data.tokenizer.vocab_size
    manager = None
    if settings.lm_eval:
        from theseus.evaluation import harness  # lm-eval is optional: ConfigError saying what to install

        include = settings.lm_eval_include and os.path.expanduser(settings.lm_eval_include)
        manager = harness.task_manager(list(settings.lm_eval), include)
    score_fn = jax.jit(functools.partial(log_likelihoods, model=model, vocab_size=vocab_size))
    return Evaluations(sources, tasks, score_fn, model.seq_len, seed, prefetch, data.bytes_per_token,
                       isinstance(data, Mixture), model=model, tokenizer=data.tokenizer, vocab_size=vocab_size,
                       harness=settings if settings.lm_eval else None, manager=manager)


def evaluate(params: Any, evaluations: Evaluations, *, loss: Callable, val_metrics: Callable, sharding: NamedSharding,
             rules: LogicalRules, share: tuple[int, int], batch_size: int, batches: int,
             split: str = "val") -> dict[str, float]:
    """Every metric of one evaluation of ``params``.

    ``loss(params, batch [batch_size, *example]) -> (mean loss, metrics)`` (the compiled eval
    step; metrics the task's means over the batch, logged as ``val_NAME``);
    ``val_metrics(loss, bytes_per_token) -> {"val_loss": ..., ...}`` (the task's), for the whole
    mixture and, suffixed ``/NAME``, for each of its sources;
    ``sharding`` lays such a batch out on the mesh; ``rules`` are the model's logical-axis rules;
    this process reads share ``index`` of ``count`` of every batch. Each source contributes
    ``batches`` validation batches of ``batch_size`` examples, the same ones every time (a
    dataset with ``validation``, task=sft's conversations or task=dpo's pairs, every validation
    example once, the batches weighted by what each holds: the mean over every target, or pair);
    each task scores ``batch_size`` examples (all their choices) per forward. ``split``: ``all``
    scores every example of such a dataset instead of its validation split (``LossTask.EVALUATE_SPLIT``).
    """
    index, count = share

    def scored(weighted: Iterable[tuple[Any, int]]) -> dict[str, float]:
        """The mean loss and metrics over ``(batch, weight)`` pairs, a few batches on the devices at a time."""
        steps = ((loss(params, _placed(batch, sharding, batch_size)), n) for batch, n in weighted)  # run when drawn
        return _weighted_means(fetched(steps))

    by_source: dict[str, dict[str, float]] = {}  # NAME -> {"loss": ..., the task's metrics}
    for name, (dataset, _) in evaluations.sources.items():
        if isinstance(dataset, WholeValidation):  # every validation example once, batches weighted by their targets
            by_source[name] = scored(dataset.validation(evaluations.seq_len, batch_size, index, count, split=split))
            continue
        loader = dataset.loader("val", evaluations.seq_len, batch_size // count, seed=evaluations.seed,
                                process_index=index, process_count=count, prefetch=evaluations.prefetch)
        by_source[name] = scored((next(loader), 1) for _ in range(batches))  # the mean of the batches' means
        loader.close()
    mixed = {key: sum(weight * by_source[name][key] for name, (_, weight) in evaluations.sources.items())
             for key in by_source[next(iter(by_source))]}
    metrics = {**val_metrics(mixed.pop("loss"), evaluations.bytes_per_token),
               **{f"val_{key}": value for key, value in mixed.items()}}
    if evaluations.mixed:
        for name, (dataset, _) in evaluations.sources.items():
            own = dict(by_source[name])
            metrics.update({f"{key}/{name}": value for key, value in
                            {**val_metrics(own.pop("loss"), dataset.bytes_per_token),
                             **{f"val_{key}": value for key, value in own.items()}}.items()})
    choices = NamedSharding(sharding.mesh, PartitionSpec(*sharding.spec, None))
    with jax.set_mesh(sharding.mesh), nn.logical_axis_rules(rules):
        for name, examples in evaluations.tasks.items():
            scores = score(params, examples, evaluations.score_fn, choices, batch_size, share)
            evaluations.samples[name] = per_example(scores, examples)
            metrics.update({f"eval/{name}/{key}": value for key, value in accuracy(scores, examples).items()})
    if evaluations.harness is not None:
        from theseus.evaluation import harness

        settings = evaluations.harness
        lm = harness.HarnessLM(evaluations.model, params, evaluations.tokenizer, sharding.mesh, rules, batch_size,
                               evaluations.vocab_size, seed=evaluations.seed, share=share)
        found, samples, results = harness.run_tasks(lm, list(settings.lm_eval), evaluations.manager,
                                                    settings.lm_eval_fewshot, settings.lm_eval_limit)
        metrics.update(found)
        evaluations.samples.update(samples)
        evaluations.harness_results.clear()
        evaluations.harness_results.update(results)
    return metrics


def _placed(batch: Any, sharding: NamedSharding, batch_size: int) -> Any:
    """This process's share of a batch (each leaf of the example's pytree) as the global batch of ``batch_size``."""
    return jax.tree.map(lambda leaf: on_devices(leaf, sharding, (batch_size, *leaf.shape[1:])), batch)


def _weighted_means(weighted: Iterable[tuple[tuple[Any, dict[str, Any]], int]]) -> dict[str, float]:
    """``{"loss": ..., METRIC: ...}``: the means of the eval steps' ``(loss, metrics)`` (host values) over
    batches, weighted by each batch's count (its targets, or pairs; 1: the mean of the batches' means)."""
    values = [({"loss": loss, **metrics}, n) for (loss, metrics), n in weighted]
    total = max(sum(n for _, n in values), 1)
    return {key: sum(float(v[key]) * n for v, n in values) / total for key in values[0][0]}
