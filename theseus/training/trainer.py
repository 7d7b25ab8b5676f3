"""The trainer: resolve a composed config into a run, then train it on the device mesh.

``Trainer(cfg)`` checks everything that can be checked before work starts (keys, shapes,
mesh, batch, data) and raises ConfigError in one line; ``Trainer.run(run_dir)`` trains,
evaluates, logs and checkpoints, resuming where the run directory left off.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.table import Table

from theseus.base.axis import BATCH_MESH_AXES, ShardingPlan
from theseus.base.hardware import peak_flops
from theseus.base.mesh import MeshConfig, compiler_options, make_mesh, on_devices, use_cpu_devices
from theseus.config import ConfigError, configuration, configure
from theseus.config.registry import model_class
from theseus.data.config import DataConfig
from theseus.data.dataset import open_dataset
from theseus.interop.hf_config import arch_of
from theseus.interop.init_from import apply_init_from
from theseus.interop.loading import load_params
from theseus.tasks.evaluation import evaluate, load_evaluations
from theseus.tasks.task import LossTask, task_class
from theseus.training.checkpoint import Checkpointer
from theseus.training.config import TrainerConfig
from theseus.training.fit_check import Fit, check_fit, device_memory
from theseus.training.logger import LoggerConfig, RunLogger, scrub, secrets
from theseus.training.loop import Hook, Loop
from theseus.training.metrics import format_bytes, memory_report, throughput, xla_flops
from theseus.training.optimizer import make_optimizer, optimizer_class
from theseus.training.preemption import Preemption
from theseus.training.profiler import Profiler
from theseus.training.resume import check_resume
from theseus.training.state import TrainState, bytes_per_device, n_params, sharded_init
from theseus.training.step import eval_step, train_step

VOCAB_MULTIPLE = 128  # a vocabulary taken from the tokenizer is padded to a multiple of this
REMAT_COMPILE_BUDGET_S = 60.0  # a dry run whose step compiled faster compiles each remat policy to advise


class TrainingError(RuntimeError):
    """A run that cannot go on (non-finite values): reported in one line, like a ConfigError."""


@dataclass
class Compiled:
    """What ``Trainer.build`` makes: the mesh, the state's layout and the compiled steps."""

    mesh: Mesh
    init: Any  # () -> TrainState, created sharded
    target: TrainState  # ShapeDtypeStructs with shardings: what a checkpoint restores onto
    step: Any  # (state, batch [accum, micro, *example], key) -> (state, metrics); donates state. None: eval only
    evaluate: Any  # (params, batch [micro, *example]) -> loss (the task's example: lm, int32 [seq + 1])
    xla_flops: float | None  # XLA's count for one step, all devices
    memory: dict[str, int]  # XLA's memory analysis of the step, bytes per device ({}: eval only)
    batch_share: tuple[int, int]  # (index, count): the share of every batch this process reads


class Trainer:
    """A run resolved from a composed config: settings, data, model, mesh and plan."""

    def __init__(self, cfg: DictConfig):
        self.composed = cfg
        cfg = apply_init_from(cfg)  # trainer.init_from: a Hugging Face folder's architecture and tokenizer
        with configuration(cfg):
            self.settings = configure(TrainerConfig)
            self.optimizer = configure(optimizer_class(cfg))
            self.data_config = configure(DataConfig)
            self.mesh_config = configure(MeshConfig)
            self.logger_config = configure(LoggerConfig)
            self.task = configure(task_class(cfg))
        if not isinstance(self.task, LossTask):
            raise ConfigError(f"task={cfg.get('task')} runs its job itself, not in the trainer: "
                              f"run it with python -m theseus.run")
        s = self.settings  # each settings class has checked its own ranges
        use_cpu_devices(self.mesh_config.cpu_devices)  # before anything counts the devices
        self.mesh_shape = self.mesh_config.shape(jax.device_count())
        parallel = self.batch_parallel
        if s.batch_size % (s.grad_accum * parallel):
            raise ConfigError(
                f"trainer.batch_size={s.batch_size} must divide by trainer.grad_accum={s.grad_accum} x "
                f"mesh.data x mesh.fsdp x mesh.expert={parallel}: use a multiple of {s.grad_accum * parallel}"
            )
        if s.batch_size % jax.process_count():
            raise ConfigError(f"trainer.batch_size={s.batch_size} must divide by the {jax.process_count()} "
                              f"processes: each reads an equal share of every batch")
        with configuration(cfg):  # the model's own checks, before the data is prepared (minutes)
            configure(model_class(cfg), vocab_size=OmegaConf.select(cfg, "architecture.vocab_size") or VOCAB_MULTIPLE)
        self.dataset = open_dataset(self.data_config)
        self.cfg = with_vocab(cfg, self.dataset.vocab_size)
        with configuration(self.cfg):
            self.model = configure(model_class(self.cfg))
        self.seq_len = self.model.seq_len
        for split in ("train", "val"):
            if self.dataset.n_tokens(split) < self.seq_len + 1:
                raise ConfigError(
                    f"the {split} split has {self.dataset.n_tokens(split)} tokens, fewer than one window of "
                    f"architecture.seq_len+1={self.seq_len + 1}: lower architecture.seq_len, use more data or "
                    f"raise data.val_fraction"
                )
        self.plan = self.model.plan().merge(ShardingPlan(batch=BATCH_MESH_AXES)).override(self.mesh_config.rules)
        self.evaluations = load_evaluations(self.cfg, self.dataset, self.model, self.data_config.seed, self.prefetch)
        self.resolved = scrub(OmegaConf.to_container(self.cfg, resolve=True), secrets())

    @property
    def prefetch(self) -> int:
        """Batches the loader's thread gathers ahead: ``data.prefetch``, else 8, or none on a CPU
        backend, where the thread would compete with the step for the same cores."""
        if self.data_config.prefetch is not None:
            return self.data_config.prefetch
        return 0 if jax.default_backend() == "cpu" else 8

    @property
    def batch_parallel(self) -> int:
        """The devices a batch is split over: the product of the batch's mesh axes' sizes."""
        return math.prod(self.mesh_shape[axis] for axis in BATCH_MESH_AXES)

    @property
    def tokens_per_step(self) -> int:
        return self.settings.batch_size * self.seq_len

    @functools.cached_property
    def flops_per_step(self) -> int:
        """Model FLOPs of one optimizer step: ``model.flops(seq)`` per sequence (counted once: on
        an unbound model that traces an abstract init)."""
        return self.model.flops(self.seq_len) * self.settings.batch_size

    def check_run_dir(self, run_dir: Path) -> None:
        """Refuse what ``trainer.resume`` cannot do with ``run_dir`` (before anything is written).

        ``never`` refuses a directory with checkpoints; ``auto`` refuses to continue one whose
        saved config differs in shapes, data order or optimizer; a path must exist.
        """
        resume, used = self.settings.resume, Checkpointer.exists(run_dir / "checkpoints")
        if resume == "never" and used:
            raise ConfigError(f"{run_dir} already has checkpoints and trainer.resume=never: "
                              f"choose a new hydra.run.dir, or trainer.resume=auto to continue it")
        if resume not in ("auto", "never") and not Path(resume).exists():
            raise ConfigError(f"trainer.resume={resume}: no such checkpoint; "
                              f"give a run directory, its checkpoints/ folder or one step's folder")
        saved = run_dir / ".hydra" / "config.yaml"
        if resume == "auto" and used and saved.is_file():
            check_resume(run_dir, OmegaConf.to_container(OmegaConf.load(saved), resolve=True),
                         OmegaConf.to_container(self.composed, resolve=True))

    # -- building -------------------------------------------------------------------------

    def build(self, train: bool = True) -> Compiled:
        """Mesh, sharded state layout, and the eval step compiled ahead of time; with ``train``
        (not needed to evaluate a checkpoint) the train step too, with XLA's FLOPs and memory."""
        s = self.settings
        mesh = make_mesh(self.mesh_config)
        batch_share = self.batch_share(mesh)
        tx, schedule = make_optimizer(self.optimizer, s.max_steps)
        init, target, shardings = sharded_init(self.model, tx, self.seq_len, s.seed, self.plan, mesh)
        replicated = NamedSharding(mesh, PartitionSpec())
        micro = s.batch_size // s.grad_accum
        example = self.task.example(self.seq_len)
        tokens = jax.ShapeDtypeStruct((s.grad_accum, micro, *example.shape), example.dtype,
                                      sharding=self.batch_sharding(mesh, accumulated=True))
        eval_tokens = jax.ShapeDtypeStruct((micro, *example.shape), example.dtype, sharding=self.batch_sharding(mesh))
        key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=replicated)
        step = jax.jit(
            functools.partial(train_step, model=self.model, task=self.task, tx=tx, schedule=schedule,
                              skip_nonfinite=s.skip_nonfinite),
            out_shardings=(shardings, replicated), donate_argnums=0,
        )
        evaluate = jax.jit(functools.partial(eval_step, model=self.model, task=self.task),
                           out_shardings=replicated)
        with jax.set_mesh(mesh), nn.logical_axis_rules(self.plan.rules()):
            options = compiler_options(self.mesh_config)
            step = step.lower(target, tokens, key).compile(options) if train else None
            evaluate = evaluate.lower(target.params, eval_tokens).compile(options)
        measured = xla_flops(step) if train else None
        if measured is not None:  # XLA counts one device's share, and a scan's body once
            measured *= jax.device_count() * s.grad_accum
        memory = memory_report(step) if train else {}
        return Compiled(mesh, init, target, step, evaluate, measured, memory, batch_share)

    def batch_sharding(self, mesh: Mesh, accumulated: bool = False) -> NamedSharding:
        """Sequences split over (data, fsdp, expert); ``accumulated`` batches lead with grad_accum."""
        spec = PartitionSpec(None, BATCH_MESH_AXES, None) if accumulated else PartitionSpec(BATCH_MESH_AXES, None)
        return NamedSharding(mesh, spec)

    def peak(self) -> tuple[float, str]:
        return peak_flops(jax.local_devices()[0], self.model._activation_dtype, self.settings.peak_flops)

    # -- running --------------------------------------------------------------------------

    def dry_run(self) -> None:
        """Build and compile, print parameters, FLOPs, memory and a step-time estimate; write nothing."""
        seconds, compiled = _timed(self.build)
        peak, source = self.peak()
        abstract_params = compiled.target.params
        rows = self._describe(compiled, peak, source, n_params(abstract_params))
        rows.append(("step time at 100% MFU", f"{self.flops_per_step / (peak * jax.device_count()) * 1e3:.2f} ms"))
        fit = self.fit(compiled.memory, seconds < REMAT_COMPILE_BUDGET_S) if compiled.memory else None
        rows += fit.rows() if fit else []
        if jax.process_index() == 0:
            _print_table("theseus dry run", rows)
        if fit and not fit.fits:
            _warn(fit.message())

    def fit(self, memory: dict[str, int], compile_candidates: bool) -> Fit:
        """Whether the step (XLA ``memory`` per device) fits the device (``trainer.memory_limit``
        overrides its size); with ``compile_candidates``, remat policies are compiled to advise."""
        s = self.settings
        limit, source = ((s.memory_limit, "trainer.memory_limit") if s.memory_limit
                         else device_memory(jax.local_devices()[0]))
        remat = getattr(self.model, "remat", None)

        def remat_memory(policy: str) -> dict[str, int]:
            cfg = self.composed.copy()
            OmegaConf.update(cfg, "architecture.remat", policy, force_add=True)
            return Trainer(cfg).build().memory

        return check_fit(memory, limit, source, batch_size=s.batch_size, grad_accum=s.grad_accum,
                         parallel=self.batch_parallel, remat=remat,
                         remat_memory=remat_memory if compile_candidates else None)

    def run(self, run_dir: Path) -> float:
        """Train to ``trainer.max_steps``, resuming from checkpoints; returns the final val loss."""
        self.check_run_dir(run_dir)
        loop = self.start(run_dir)
        hooks = self.hooks()
        with loop.logger, Preemption() as loop.preemption:
            if loop.step >= loop.last_step:
                loop.logger.message(f"{run_dir} is complete at step {loop.step}: nothing to train")
                loop.val_loss = self.evaluation_metrics(loop.compiled, loop.state.params)["val_loss"]
            while loop.step < loop.last_step and not loop.stop:
                self.train_step(loop)
                with loop.window.pause():  # the hooks' time is not step time
                    for hook in hooks:
                        hook(loop)
            loop.profiler.close(loop.state)
            loop.checkpointer.wait()
            if loop.stop:
                self._report_stop(loop)
            loop.checkpointer.close()
            loop.logger.summary(final_val_loss=loop.val_loss)
        if loop.stop:
            raise SystemExit(128 + loop.stop)  # the shell's code for a process ended by that signal
        return loop.val_loss

    def start(self, run_dir: Path) -> Loop:
        """Compile, restore the state (a checkpoint or a fresh init) and the loader, open the
        logger with the run's summary: the loop before its first step."""
        s = self.settings
        compiled = self.build()
        checkpointer = Checkpointer(run_dir / "checkpoints", s.keep_checkpoints)
        state, start, loader_state = self._restore(checkpointer, compiled)
        index, count = compiled.batch_share
        loader = self.dataset.loader("train", self.seq_len, s.batch_size // count, seed=self.data_config.seed,
                                     process_index=index, process_count=count, prefetch=self.prefetch)
        if loader_state is not None:
            loader.set_state(loader_state)
        peak, source = self.peak()
        if jax.process_index() == 0:
            _print_table("theseus run", self._describe(compiled, peak, source, n_params(state.params)))
        logger = RunLogger(self.logger_config, run_dir, resolved_config=self.resolved, total_steps=s.max_steps,
                           start_step=start, is_main=jax.process_index() == 0)
        logger.summary(**self._summary(compiled, peak, source, n_params(state.params)))
        return Loop(run_dir, compiled, state, loader, logger, checkpointer, jax.random.key(s.seed + 1), peak,
                    step=start, last_step=s.max_steps, profiler=Profiler(s.profile_steps, run_dir / "profile"))

    def hooks(self) -> list[Hook]:
        """What runs after every step, in order; each acts on its own cadence. ``log`` comes
        first: the window it closes ends when its last step has finished."""
        return [self.log, self.preempt, self.evaluate, self.checkpoint]

    def train_step(self, loop: Loop) -> None:
        """One optimizer step on the loader's next batch (dispatched: nothing waits for it)."""
        loop.profiler.on_step(loop.step + 1, loop.state)
        tokens = self._global_batch(next(loop.loader), loop.compiled.mesh)
        loop.state, loop.metrics = loop.compiled.step(loop.state, tokens, loop.dropout_key)
        loop.step += 1
        loop.window.add(loop.metrics["loss"], loop.loader.last_wait)

    def log(self, loop: Loop) -> None:
        """Every ``trainer.log_every`` steps: log the window's metrics."""
        if loop.due(self.settings.log_every):
            self.log_window(loop)

    def log_window(self, loop: Loop) -> dict[str, float]:
        """Log the metrics of the steps since the last log (``loss``: their mean; lr, grad_norm:
        the last step's; throughput from the mean step time), then stop on a NaN/Inf."""
        metrics = loop.window.close(loop.metrics)
        metrics.update(throughput(metrics["step_time"], self.tokens_per_step, self.flops_per_step, loop.peak,
                                  jax.device_count()))
        loop.logger.log(loop.step, metrics)
        self._check_finite(loop.state, loop.checkpointer)
        return metrics

    def preempt(self, loop: Loop) -> None:
        """Agree on a stop signal (compared across processes at log steps only)."""
        loop.stop = loop.preemption.agreed(now=loop.due(self.settings.log_every))

    def evaluate(self, loop: Loop) -> None:
        """Every ``trainer.eval_every`` steps: the validation loss, logged with the task's metrics."""
        loop.evaluated = loop.due(self.settings.eval_every)
        if loop.evaluated:
            metrics = self.evaluation_metrics(loop.compiled, loop.state.params)
            loop.val_loss = metrics["val_loss"]
            loop.logger.log(loop.step, metrics)

    def checkpoint(self, loop: Loop) -> None:
        """Every ``trainer.checkpoint_every`` steps, and when stopping: save (asynchronously)."""
        if loop.due(self.settings.checkpoint_every) or loop.stop:
            self._check_finite(loop.state, loop.checkpointer)
            loop.checkpointer.save(loop.step, loop.state, loop.loader.get_state(), self.resolved,
                                   loop.val_loss if loop.evaluated else None)

    def _report_stop(self, loop: Loop) -> None:
        again = [arg for arg in sys.argv[1:] if not arg.startswith("hydra.run.dir=")]
        loop.logger.message(f"stopped by signal {loop.stop} after step {loop.step}; checkpoint saved. "
                            f"Resume with: python -m theseus.run {' '.join(again)} hydra.run.dir={loop.run_dir}")

    def _check_finite(self, state: TrainState, checkpointer: Checkpointer) -> None:
        """Stop (TrainingError) once a step's loss or gradients were NaN/Inf, unless skipping them."""
        first = int(state.first_nonfinite)
        if first and not self.settings.skip_nonfinite:
            checkpointer.wait()
            kept = checkpointer.steps()
            last = f"the last good checkpoint is step {kept[-1]}" if kept else "no checkpoint was written"
            raise TrainingError(f"the loss or gradients became NaN/Inf at step {first}; stopped ({last}). "
                                f"Lower optimizer.lr or raise optimizer.warmup_steps, or set "
                                f"trainer.skip_nonfinite=true to skip such updates")

    def _restore(self, checkpointer: Checkpointer, compiled: Compiled) -> tuple[TrainState, int, dict | None]:
        """The state to start from: a checkpoint (per ``trainer.resume``) or a fresh init."""
        resume = self.settings.resume
        source = checkpointer if resume in ("auto", "never") else Checkpointer.at(Path(resume))
        restored = source.restore(compiled.target, step=source.requested_step, report=_warn)
        if restored is None:
            return self._fresh_state(compiled), 0, None
        state, loader_state, _config, step = restored
        _warn(f"resuming from {source.directory / str(step)} at step {step}")
        return state, step, loader_state

    def _fresh_state(self, compiled: Compiled) -> TrainState:
        """A new state: initialised, or with ``trainer.init_from``'s weights (optimizer fresh),
        loaded onto their shards after the initialised params are dropped."""
        state = compiled.init()
        if self.settings.init_from is None:
            return state
        folder = Path(self.settings.init_from).expanduser()
        _warn(f"starting from the weights of {folder}")
        state = state.replace(params=None)
        return state.replace(params=load_params(folder, arch_of(self.model), compiled.target.params))

    def batch_share(self, mesh: Mesh) -> tuple[int, int]:
        """``(index, count)``: this process reads share ``index`` of ``count`` equal, contiguous
        shares of every batch, the sequences its devices hold under the batch sharding.

        ``count`` is the number of processes when the batch's mesh axes split it across them;
        processes whose devices hold the same sequences (a tensor axis spanning hosts) read the
        same share.
        """
        micro = self.settings.batch_size // self.settings.grad_accum
        held = {(rows.start or 0, micro if rows.stop is None else rows.stop)
                for rows, *_ in self.batch_sharding(mesh).addressable_devices_indices_map((micro, 1)).values()}
        first, end = min(start for start, _ in held), max(stop for _, stop in held)
        if sum(stop - start for start, stop in held) != end - first or first % (end - first):
            raise ConfigError(f"process {jax.process_index()}'s devices hold sequences {sorted(held)} of each "
                              f"batch of {micro}, not one contiguous share: give mesh.data x mesh.fsdp x mesh.expert a multiple "
                              f"of the {jax.process_count()} processes, or make it 1")
        return first // (end - first), micro // (end - first)

    def _global_batch(self, host: np.ndarray, mesh: Mesh) -> jax.Array:
        """This process's ``[local_batch, seq + 1]`` tokens as one global, sharded array."""
        s = self.settings
        local = host.reshape(s.grad_accum, -1, host.shape[-1])
        shape = (s.grad_accum, s.batch_size // s.grad_accum, host.shape[-1])
        return on_devices(local, self.batch_sharding(mesh, accumulated=True), shape)

    def evaluation_metrics(self, compiled: Compiled, params: Any) -> dict[str, float]:
        """Every evaluation's metrics (``val_loss``, per source, multiple-choice tasks) on
        ``trainer.eval_batches`` batches of each validation split (the same each time): the
        loop's, and ``python -m theseus.evaluate``'s of a checkpoint."""
        s = self.settings
        return evaluate(params, self.evaluations, loss=compiled.evaluate, val_metrics=self.task.val_metrics,
                        sharding=self.batch_sharding(compiled.mesh), rules=self.plan.rules(),
                        share=compiled.batch_share, batch_size=s.batch_size // s.grad_accum, batches=s.eval_batches)

    def _summary(self, compiled: Compiled, peak: float, source: str, params: int) -> dict[str, Any]:
        """What the run records about itself, the FLOPs convention included."""
        analytic = self.flops_per_step
        ratio = compiled.xla_flops / analytic if compiled.xla_flops else None
        if ratio is not None and abs(ratio - 1) > 0.25:
            _warn(f"warning: analytic FLOPs/step {analytic:.3e} differ from XLA's {compiled.xla_flops:.3e} "
                  f"by more than 25%")
        return {"n_params": params, "flops_per_step": analytic, "xla_flops_per_step": compiled.xla_flops,
                "flops_ratio_xla": ratio, "peak_flops": peak, "peak_flops_source": source,
                "device_kind": jax.local_devices()[0].device_kind, "n_devices": jax.device_count(),
                "mesh": self.mesh_shape,
                "flops_convention": "model.flops(seq): forward+backward, 6 x matmul params x seq + "
                                    "12 x n_layers x d_model x seq^2 per sequence; MFU = FLOP/s / (peak x devices)"}

    def _describe(self, compiled: Compiled, peak: float, source: str, params: int) -> list[tuple[str, str]]:
        shapes = compiled.target
        rows = [
            ("model", f"{type(self.model).__name__}: {params:,} parameters"),
            ("mesh", " x ".join(f"{k}={v}" for k, v in self.mesh_shape.items())
             + f" = {jax.device_count()} x {jax.local_devices()[0].device_kind}"),
            ("params / device", format_bytes(bytes_per_device(shapes.params))),
            ("optimizer state / device", format_bytes(bytes_per_device(shapes.opt_state))),
            ("tokens / step", f"{self.tokens_per_step:,}"),
            ("FLOPs / step", f"{self.flops_per_step:.3e} analytic"
             + (f", {compiled.xla_flops:.3e} XLA ({compiled.xla_flops / self.flops_per_step:.2f}x)"
                if compiled.xla_flops else "")),
            ("peak FLOP/s / device", f"{peak:.3e} ({source})"),
        ]
        rows += [(f"XLA {name} / device", format_bytes(v)) for name, v in compiled.memory.items()]
        return rows


def with_vocab(cfg: DictConfig, vocab_size: int) -> DictConfig:
    """``cfg`` with architecture.vocab_size from the tokenizer (or checked against it).

    Unset, it is the tokenizer's size rounded up to a multiple of VOCAB_MULTIPLE, so that the
    embedding splits evenly over tensor-parallel devices and matmuls tile well (nanoGPT pads
    GPT-2's 50257 to 50304 for the same reason); the extra rows are never targets.
    """
    declared = OmegaConf.select(cfg, "architecture.vocab_size")
    if declared is not None and declared < vocab_size:
        raise ConfigError(
            f"architecture.vocab_size={declared} is smaller than the tokenizer's vocabulary ({vocab_size}): "
            f"set architecture.vocab_size>={vocab_size} or leave it unset"
        )
    cfg = cfg.copy()
    padded = -(-vocab_size // VOCAB_MULTIPLE) * VOCAB_MULTIPLE
    OmegaConf.update(cfg, "architecture.vocab_size", declared or padded, force_add=True)
    return cfg


def _print_table(title: str, rows: list[tuple[str, str]]) -> None:
    table = Table(title=title, show_header=False)
    for key, value in rows:
        table.add_row(key, value)
    Console(stderr=True).print(table)


def _timed(fn):
    """``(seconds, fn())``."""
    began = time.perf_counter()
    result = fn()
    return time.perf_counter() - began, result


def _warn(text: str) -> None:
    if jax.process_index() == 0:
        print(text, file=sys.stderr)
