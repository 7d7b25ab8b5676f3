"""The recipe: a composed config resolved once into a spec, assembled into a run, in the order a
reader expects.

    spec = resolve(cfg, run_dir)          # trainer.init_from's model, settings, task: checked (theseus.training.spec)
    run = assemble(spec)                  # devices, data, model, plan, mesh, state, compiled steps
    Trainer(run).run(run_dir)             # the loop

Every command assembles through ``assemble``: ``theseus.run`` (training, and the dry run of
``theseus.plan``), ``theseus.evaluate`` (``steps="eval"``), and ``sample`` and ``export``
(``theseus.cli.trained.load_trained``: no steps, the tokenizer given). Each check raises a
ConfigError in one line, before the work it guards.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import jax
from omegaconf import DictConfig, OmegaConf

from theseus.base.axis import BATCH_MESH_AXES
from theseus.base.compile_oom import oom_verdict
from theseus.base.mesh import auto_cpu_devices, make_mesh, sizable, use_cpu_devices
from theseus.config import ConfigError, Snapshot
from theseus.config.compose import with_values
from theseus.config.context import is_checked
from theseus.config.registry import chosen
from theseus.data.dataset import planned_vocab_size
from theseus.data.tokenizer import Tokenizer
from theseus.evaluation.evaluations import load_evaluations
from theseus.interop.expressible import exportable
from theseus.interop.hf_config import arch_of
from theseus.model.lora import settings_of, without_adapters
from theseus.plan.memory import check_memory
from theseus.plan.target import Target, target_named
from theseus.sources.frozen_base import FrozenBase, fingerprint, require_base
from theseus.sources.in_config import check_same_architecture, init_from_values, init_source
from theseus.sources.model_source import ModelSource, StartFrom
from theseus.sources.weights import load_params
from theseus.tasks.task import START, LossTask, StepLayout
from theseus.training.batches import batch_share, global_batch
from theseus.training.compiled import Compiled, Steps, compile_steps
from theseus.training.parts import Run, prefetch
from theseus.training.resume import check_asked, check_run_dir
from theseus.training.settings import Settings, check_model, configure_model, declared_vocab
from theseus.training.spec import RunSpec, configure_parts
from theseus.training.state import TrainState


def resolve(cfg: DictConfig, run_dir: Path | None = None) -> RunSpec:
    """The spec of a run of the composed ``cfg`` (in ``run_dir``: a LoRA run resumed there has its
    base folder checked first, before anything reads ``trainer.init_from``); ConfigError (one
    line) for what needs neither devices, data nor JAX: a group's settings, the task,
    ``trainer.init_from`` asked for what its model lacks (the model's own checks start JAX, after
    ``assemble`` has sized its CPU devices)."""
    if run_dir is not None:  # a LoRA run resumed: its base folder is there
        require_base(run_dir / "checkpoints")
    source = init_source(cfg)  # where trainer.init_from's model comes from (None: nowhere)
    derived = init_from_values(cfg, source)  # its architecture and tokenizer
    config = with_values(cfg, derived)  # laid over the composed config (kept as it is), once
    resolved = OmegaConf.to_container(config, resolve=True)
    values = Snapshot(resolved, checked=is_checked(cfg))
    spec = RunSpec(cfg, derived, resolved, source, *configure_parts(values), declared_vocab(values), run_dir)
    check_asked(spec.settings.trainer, source, config)
    if not isinstance(spec.task, LossTask):
        raise ConfigError(f"task={chosen(cfg, 'task')} runs its job itself, not in the trainer: "
                          f"run it with python -m theseus.run")
    return spec


def assemble(spec: RunSpec, *, steps: Steps = "train", tokenizer: Tokenizer | None = None,
             announce: bool = True) -> Run:
    """The run ``spec`` describes, checked and built.

    ``spec.run_dir``: the directory it trains in (its resume checked before compiling, its memory
    after); ``trainer.init_from`` is checked with or without one. ``steps``: ``"train"``,
    ``"eval"`` (the eval step alone) or None (the state's layout only). ``tokenizer``: the
    model's, when no data is read (sample, export); a planned run (``mesh.target``) reads none
    either: its tokenizer sizes the vocabulary.
    ``announce``: say that the train step compiles (a dry run's candidate settings compile quietly).
    """
    settings, task, source = spec.settings, spec.task, spec.source
    target = _target(settings)
    devices = target.devices if target else _local_devices(settings, auto=tokenizer is None)
    _check_batch(settings, settings.mesh.shape(len(devices), sizable(devices)),
                 target.process_count if target else jax.process_count(), task)
    check_model(spec.values)  # the model's own checks, before the data (which can take minutes); JAX has started
    reference = task.reference() if tokenizer is None else None  # what scores the examples once, if anything
    if isinstance(reference, ModelSource):
        check_same_architecture(OmegaConf.create(spec.resolved), reference)

    dataset = None if target or tokenizer else task.dataset(settings.data)
    spec = spec.with_vocabulary(planned_vocab_size(settings.data, spec.declared_vocab) if target
                                else (tokenizer or dataset.tokenizer).vocab_size)  # the vocabulary, set here
    model, plan = configure_model(spec.values, settings.mesh, spec.vocab_size)
    if dataset is not None:
        task.check_data(dataset, model.seq_len)
    imported = source is not None and source.imported  # a Hugging Face model keeps its vocabulary
    evaluations = (load_evaluations(spec.evaluation, dataset, model, settings.data.seed, prefetch(settings.data),
                                    imported) if dataset is not None else None)
    if spec.run_dir is not None:
        check_run_dir(spec.run_dir, spec.composed, settings)
    if source is not None:  # a checkpoint of other shapes: one line before compiling (a dry run's, a sweep's too)
        source.check_start(_start_from(settings, model), model)
    if isinstance(reference, ModelSource):
        reference.check_reference(model)

    mesh = make_mesh(settings.mesh, devices)
    say = functools.partial(_say_compiling, model, devices, settings) if steps == "train" and announce else None
    with oom_verdict(f"mesh.target={target.name}: the train step" if target else "the train step",
                     target.hbm if target else None):  # a compile out of device memory: one line
        compiled = compile_steps(model, task, plan, mesh, settings, steps, announce=say)
    share = (0, 1) if target else batch_share(mesh, settings.trainer.batch_size // settings.trainer.grad_accum)
    start = _start(settings, model, source)
    start = _once(start) if reference == START else start  # scores the examples, then starts the trainer
    rollout = None if dataset is None or steps is None else task.rollout(
        _layout(settings, model, mesh, plan, share, lambda: start(compiled, lambda text: None)[0].params), dataset)
    run = Run(spec=spec, model=model, plan=plan, devices=devices, compiled=compiled, dataset=dataset,
              evaluations=evaluations, batch_share=share, start=start,
              target=target, base=_frozen_base(source, model), rollout=rollout,
              exports=exportable(without_adapters(model)))  # merged, a LoRA run's
    if spec.run_dir is not None and steps == "train" and not settings.trainer.dry_run:
        check_memory(run)
    if dataset is not None and steps is not None and not settings.trainer.dry_run:
        _score_reference(run, source)
    return run


def _layout(settings: Settings, model, mesh, plan, share: tuple[int, int], start) -> StepLayout:
    """Where the run's steps run, for a task that makes its own batches (``LossTask.rollout``)."""
    s = settings.trainer
    return StepLayout(model, mesh, plan.rules(), s.batch_size, s.grad_accum, share, s.seed,
                      place=lambda host: global_batch(host, mesh, s.batch_size, s.grad_accum), start=start)


def derived_before_data(cfg: DictConfig) -> dict[str, Any]:
    """What a run of ``cfg`` derives before it reads data (``--cfg job`` shows it): trainer.init_from's
    architecture and tokenizer, and the vocabulary where the tokenizer alone sizes it (byte, a
    tokenizer.json or GGUF file; char and bpe are fitted to the corpus, a shard folder records its own)."""
    spec = resolve(cfg)
    data = spec.settings.data
    sources = [source for source, _ in data.sources().values()] or [data]
    if data.tokenizer in ("char", "bpe") or any(source.source == "shards" for source in sources):
        return dict(spec.derived)
    check_model(spec.values)
    return dict(spec.with_vocabulary(planned_vocab_size(data)).derived)


def _target(settings: Settings) -> Target | None:
    """``mesh.target``'s compile-only devices, for a dry run only."""
    if not settings.mesh.target:
        return None
    if not settings.trainer.dry_run:
        raise ConfigError(f"mesh.target={settings.mesh.target} plans a run on hardware this machine lacks: "
                          f"add trainer.dry_run=true (or drop mesh.target to train here)")
    return target_named(settings.mesh.target)


def _local_devices(settings: Settings, auto: bool) -> list:
    """This machine's devices; on a CPU ``mesh.cpu_devices`` of them, else (``auto``: a run, not
    a model loaded to sample or export) one per core where the micro-batch splits so. JAX's CPU
    backend is sized before anything counts its devices."""
    s, given = settings.trainer, settings.mesh.cpu_devices
    micro = s.batch_size // s.grad_accum if s.batch_size % s.grad_accum == 0 else 1
    use_cpu_devices(given or (auto_cpu_devices(settings.mesh, micro) if auto else None), given=given is not None)
    return jax.devices()


def _check_batch(settings: Settings, mesh_shape: dict[str, int], processes: int, task: LossTask) -> None:
    """The batch splits over accumulation, the batch's mesh axes and the processes, as the task needs."""
    s = settings.trainer
    parallel = math.prod(mesh_shape[axis] for axis in BATCH_MESH_AXES)
    if s.batch_size % (s.grad_accum * parallel):
        raise ConfigError(f"trainer.batch_size={s.batch_size} must divide by trainer.grad_accum={s.grad_accum} x "
                          f"mesh.data x mesh.fsdp x mesh.expert={parallel}: use a multiple of "
                          f"{s.grad_accum * parallel}")
    if s.batch_size % processes:
        raise ConfigError(f"trainer.batch_size={s.batch_size} must divide by the {processes} "
                          f"processes: each reads an equal share of every batch")
    task.check_batch(s.batch_size, s.grad_accum, processes)


def _say_compiling(model, devices: list, settings: Settings) -> None:
    """The first line of a run, before the compile that takes seconds to minutes."""
    if jax.process_index():
        return
    n, shape = len(devices), settings.mesh.shape(len(devices))
    mesh = " x ".join(f"{k}={v}" for k, v in shape.items() if v > 1)
    print(f"theseus: compiling {type(model).__name__}'s train step for {n} {devices[0].device_kind} "
          f"device{'s' if n > 1 else ''}" + (f" ({mesh})" if mesh else ""), file=sys.stderr, flush=True)


def _start_from(settings: Settings, model) -> StartFrom:
    """How a run starts from ``trainer.init_from``: the model's architecture, the seed of LoRA's
    fresh adapters, and what more than weights it takes."""
    s = settings.trainer
    return StartFrom(arch_of(model), s.seed, settings.optimizer.name, s.init_optimizer, s.init_data)


def _start(settings: Settings, model, source: ModelSource | None):
    """How a new run's state is made (``(compiled, say) -> (state, loader state)``): initialised,
    or with ``trainer.init_from``'s weights (a theseus checkpoint's, with its optimizer state and
    data position when asked; a Hugging Face folder's or GGUF file's, loaded onto their shards);
    LoRA's adapters a source lacks start fresh from ``trainer.seed``."""
    if source is None:
        return lambda compiled, say: (compiled.init(), None)
    return functools.partial(source.start, how=_start_from(settings, model))


def _frozen_base(source: ModelSource | None, model) -> FrozenBase | None:
    """A LoRA run's base when ``trainer.init_from`` gives one (a Hugging Face folder, a GGUF file,
    or a theseus checkpoint: the step it names, else its newest): its checkpoints then hold the
    adapters alone (a random base is saved whole)."""
    if source is None or not settings_of(model).rank:
        return None
    arch = arch_of(model)
    return FrozenBase(source.base_path, lambda path, layout: load_params(path, arch, layout))


def _score_reference(run: Run, source: ModelSource | None) -> None:
    """Have the task's examples scored by its reference model (``LossTask.reference``; ``dpo``'s),
    once: read back from the data cache when that reference scored them before, else computed on
    the run's mesh. The run's own start (``source``: ``trainer.init_from``'s, or initialised) is
    made here and kept for the trainer (its params are the reference until the first step);
    another model is loaded onto the run's layout, used and dropped: while training, its weights
    are not on the devices."""
    reference = run.task.reference()
    if reference is None:
        return
    seq_len, fingerprint = run.model.seq_len, _reference_fingerprint(source if reference == START else reference, run)
    if run.dataset.cached_reference(seq_len, fingerprint):
        return
    say = functools.partial(print, file=sys.stderr) if jax.process_index() == 0 else lambda text: None
    params = (run.start(run.compiled, say)[0].params if reference == START  # the run's own start, made once
              else _reference_params(reference, run))
    run.dataset.score_reference(seq_len, fingerprint, functools.partial(run.score_reference, params), run.micro_batch,
                                *run.batch_share)


def _reference_fingerprint(weights: ModelSource | None, run: Run) -> str:
    """What a reference's outputs depend on: its weights (``weights``' fingerprint; None: the
    run's initialisation, its seed), the model computing them and the backend."""
    described = {"weights": fingerprint(weights.base_path) if weights else f"initialised, seed {run.settings.trainer.seed}",
                 "model": run.record["choices"]["model"], "architecture": run.record["architecture"],
                 "backend": jax.default_backend()}
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()


def _reference_params(source: ModelSource, run: Run):
    """A reference's weights on the run's layout (a LoRA run's adapters zero: the base's function)."""
    try:
        return source.load_params(arch_of(run.model), run.compiled.target.params)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc} (a reference has the policy's architecture and vocabulary)") from exc


def _once(start):
    """``start`` whose state is made at its first call and returned to every later one: a run whose
    reference is its own start (``LossTask.reference``: START) scores its examples with it, and
    the trainer then starts from it."""
    made = []

    def once(compiled: Compiled, say) -> tuple[TrainState, dict | None]:
        if not made:
            made.append(start(compiled, say))
        return made[0]

    return once

