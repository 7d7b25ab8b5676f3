"""The trainer: resolve a composed config into a run, then train it on the device mesh.

``Trainer(cfg)`` checks everything that can be checked before work starts (keys, shapes,
mesh, batch, data) and raises ConfigError in one line; ``Trainer.run(run_dir)`` trains,
evaluates, logs and checkpoints, resuming where the run directory left off.
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from omegaconf import DictConfig, OmegaConf
from optax import ScaleByScheduleState

from theseus.base.axis import BATCH_MESH_AXES
from theseus.base.hardware import peak_flops
from theseus.base.mesh import auto_cpu_devices, compiler_options, make_mesh, on_devices, use_cpu_devices
from theseus.base.target import Target, resolve
from theseus.config import ConfigError, configuration, configure
from theseus.config.registry import chosen, read_saved
from theseus.data.dataset import open_dataset, planned_vocab_size
from theseus.interop.hf_config import arch_of
from theseus.interop.init_from import apply_init_from, run_of, theseus_checkpoint
from theseus.interop.loading import load_params
from theseus.tasks.evaluation import EvaluationConfig, evaluate, load_evaluations
from theseus.tasks.task import LossTask, task_class
from theseus.training.checkpoint import Checkpointer, path_shapes
from theseus.training.fit_check import Fit, check_fit, device_memory
from theseus.training.logger import LoggerConfig, RunLogger, scrub, secrets, sync_command
from theseus.training.loop import Hook, LoopState
from theseus.training.metrics import format_bytes, format_duration, format_si, memory_report, throughput, xla_flops
from theseus.training.optimizer import make_optimizer, make_schedule
from theseus.training.predict import Prediction, predict
from theseus.training.preemption import Preemption
from theseus.training.profiler import Profiler
from theseus.training.progress import RunConsole, evaluation_line
from theseus.training.resolve import check_model, configure_settings, resolve_model
from theseus.training.resume import check_resume, init_from_problem
from theseus.training.state import TrainState, bytes_per_device, n_params, param_shapes, sharded_init
from theseus.training.step import eval_step, train_step

ADVICE_COMPILE_BUDGET_S = 60.0  # a dry run whose step compiled faster compiles each setting it would advise


class TrainingError(RuntimeError):
    """A run that cannot go on (non-finite values): reported in one line, like a ConfigError."""


@dataclass
class Compiled:
    """What ``Trainer.build`` makes: the mesh, the state's layout and the compiled steps."""

    mesh: Mesh
    init: Any  # () -> TrainState, created sharded
    target: TrainState  # ShapeDtypeStructs with shardings: what a checkpoint restores onto
    step: Any  # (state, batch [accum, micro, *example], key) -> (state, metrics); donates state. None: eval only
    eval_step: Any  # (params, batch [micro, *example]) -> loss (the task's example: lm, int32 [seq + 1])
    xla_flops: float | None  # XLA's count for one step, all devices
    memory: dict[str, int]  # XLA's memory analysis of the step, bytes per device ({}: eval only)
    batch_share: tuple[int, int]  # (index, count): the share of every batch this process reads


class Trainer:
    """A run resolved from a composed config: settings, data, model, mesh and plan."""

    def __init__(self, cfg: DictConfig):
        self.composed = cfg
        cfg = apply_init_from(cfg)  # trainer.init_from: a Hugging Face folder's architecture and tokenizer
        self.settings = configure_settings(cfg)  # .trainer, .optimizer, .data, .mesh: each checked
        with configuration(cfg):
            self.logging = configure(LoggerConfig)
            self.task = configure(task_class(cfg))
            self.evaluation = configure(EvaluationConfig)  # its files checked before the data is prepared
        if not isinstance(self.task, LossTask):
            raise ConfigError(f"task={chosen(cfg, 'task')} runs its job itself, not in the trainer: "
                              f"run it with python -m theseus.run")
        s = self.settings.trainer
        micro = s.batch_size // s.grad_accum if s.batch_size % s.grad_accum == 0 else 1
        given = self.settings.mesh.cpu_devices  # else a device per core, when the batch splits so
        use_cpu_devices(given or auto_cpu_devices(self.settings.mesh, micro), given=given is not None)
        if self.settings.mesh.target and not s.dry_run:
            raise ConfigError(f"mesh.target={self.settings.mesh.target} plans a run on hardware this machine lacks: "
                              f"add trainer.dry_run=true (or drop mesh.target to train here)")
        self.target: Target | None = resolve(self.settings.mesh.target) if self.settings.mesh.target else None
        self.devices = self.target.devices if self.target else jax.devices()
        self.mesh_shape = self.settings.mesh.shape(len(self.devices))
        parallel = self.batch_parallel
        if s.batch_size % (s.grad_accum * parallel):
            raise ConfigError(
                f"trainer.batch_size={s.batch_size} must divide by trainer.grad_accum={s.grad_accum} x "
                f"mesh.data x mesh.fsdp x mesh.expert={parallel}: use a multiple of {s.grad_accum * parallel}"
            )
        processes = self.target.process_count if self.target else jax.process_count()
        if s.batch_size % processes:
            raise ConfigError(f"trainer.batch_size={s.batch_size} must divide by the {processes} "
                              f"processes: each reads an equal share of every batch")
        check_model(cfg)
        # a planned run reads no data (its corpus may be on the cluster): the tokenizer alone sizes the vocabulary
        self.dataset = None if self.target else open_dataset(self.settings.data)
        vocab = (planned_vocab_size(self.settings.data, OmegaConf.select(cfg, "architecture.vocab_size"))
                 if self.target else self.dataset.vocab_size)
        self.cfg, self.model, self.plan = resolve_model(cfg, vocab, self.settings.mesh)
        self.seq_len = self.model.seq_len
        for split in ("train", "val") if self.dataset else ():
            if self.dataset.n_tokens(split) < self.seq_len + 1:
                raise ConfigError(
                    f"the {split} split has {self.dataset.n_tokens(split)} tokens, fewer than one window of "
                    f"architecture.seq_len+1={self.seq_len + 1}: lower architecture.seq_len, use more data or "
                    f"raise data.val_fraction"
                )
        self.evaluations = load_evaluations(self.cfg, self.dataset, self.model, self.settings.data.seed, self.prefetch,
                                            self.evaluation) if self.dataset else None
        self.resolved = scrub(OmegaConf.to_container(self.cfg, resolve=True), secrets())
        self._built: Compiled | None = None  # the training build, once the memory check has made it
        self.console = RunConsole()  # what the run shows; its transcript is open while it runs

    def _say(self, text: str) -> None:
        """A line on the console (and in the transcript), from process 0 only."""
        if jax.process_index() == 0:
            self.console.show(text)

    def _say_compiling(self) -> None:
        """The first line of a run or a dry run, before the compile that takes seconds to minutes."""
        n, mesh = len(self.devices), " x ".join(f"{k}={v}" for k, v in self.mesh_shape.items() if v > 1)
        self._say(f"theseus: compiling {type(self.model).__name__}'s train step for {n} {self.devices[0].device_kind} "
                  f"device{'s' if n > 1 else ''}" + (f" ({mesh})" if mesh else ""))

    @property
    def prefetch(self) -> int:
        """Batches the loader's thread gathers ahead: ``data.prefetch``, else 8, or none on a CPU
        backend, where the thread would compete with the step for the same cores."""
        if self.settings.data.prefetch is not None:
            return self.settings.data.prefetch
        return 0 if jax.default_backend() == "cpu" else 8

    @property
    def batch_parallel(self) -> int:
        """The devices a batch is split over: the product of the batch's mesh axes' sizes."""
        return math.prod(self.mesh_shape[axis] for axis in BATCH_MESH_AXES)

    @property
    def tokens_per_step(self) -> int:
        return self.settings.trainer.batch_size * self.seq_len

    @functools.cached_property
    def flops_per_step(self) -> int:
        """Model FLOPs of one optimizer step: ``model.flops(seq)`` per sequence (counted once: on
        an unbound model that traces an abstract init)."""
        return self.model.flops(self.seq_len) * self.settings.trainer.batch_size

    def check_run_dir(self, run_dir: Path) -> None:
        """Refuse what the run cannot do with ``run_dir`` (before anything is written).

        ``trainer.resume``: ``never`` refuses a directory with checkpoints; ``auto`` (and
        ``last``, which has chosen ``run_dir``) refuses to continue one whose saved config
        differs in shapes, data order or optimizer, or whose ``trainer.max_steps`` changes the
        learning rates of steps already taken; a path must hold checkpoints. Then the step is
        compiled and its memory checked against the device's (not for a dry run, which
        reports it instead).
        """
        resume, used = self.settings.trainer.resume, Checkpointer.exists(run_dir / "checkpoints")
        if resume == "never" and used:
            raise ConfigError(f"{run_dir} already has checkpoints and trainer.resume=never: "
                              f"choose a new hydra.run.dir, or trainer.resume=auto to continue it")
        if resume not in ("auto", "last", "never") and theseus_checkpoint(Path(resume)) is None:
            raise ConfigError(f"trainer.resume={resume} is not a checkpoint: give a run directory with "
                              f"checkpoints/, its checkpoints/ folder or one step's folder (or auto, last, never)")
        saved = run_dir / ".hydra" / "config.yaml"
        if resume in ("auto", "last") and used and saved.is_file():
            old = OmegaConf.to_container(read_saved(saved), resolve=True)
            check_resume(run_dir, old, OmegaConf.to_container(self.composed, resolve=True),
                         self._extension_problem(run_dir, old["trainer"]["max_steps"]))
        if not self.settings.trainer.dry_run:
            self._check_init_from()
            self._check_memory()

    def _extension_problem(self, run_dir: Path, saved_steps: int) -> str | None:
        """Why ``run_dir`` (trained for ``saved_steps``) cannot go on to this run's
        ``trainer.max_steps``: the steps it has taken would have had other learning rates
        (a cosine decays over all the steps); None when they keep theirs (a constant
        schedule, or wsd's stable phase)."""
        taken = max((int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()), default=0)
        steps, optimizer, max_steps = jax.numpy.arange(taken), self.settings.optimizer, self.settings.trainer.max_steps
        before = np.asarray(make_schedule(optimizer, saved_steps)(steps))
        after = np.asarray(make_schedule(optimizer, max_steps)(steps))
        changed = np.flatnonzero(~np.isclose(before, after, rtol=1e-6, atol=0))
        if not changed.size:
            return None
        first = int(changed[0])
        if optimizer.schedule == "cosine":
            extends = "a constant or wsd schedule can be extended in place"
        else:  # the warmup was cut to the steps the run had, or a wsd's decay has begun
            extends = (f"a {optimizer.schedule} schedule extends in place only once its warmup "
                       f"(optimizer.warmup_steps={optimizer.warmup_steps}) is over"
                       + (" and before its decay" if optimizer.schedule == "wsd" else ""))
        return (f"with optimizer.schedule={optimizer.schedule} the learning rate of step {first + 1} (of the "
                f"{taken} taken) would have been {after[first]:.3g}, not {before[first]:.3g}. Start a new run from "
                f"its weights instead: trainer.init_from={run_dir} trainer.max_steps={max_steps} "
                f"hydra.run.dir=NEW (trainer.init_optimizer=true keeps its optimizer state); {extends}")

    def _init_source(self) -> tuple[Checkpointer, Any, str | None] | None:
        """``trainer.init_from`` when a theseus checkpoint: its checkpoints, the layout of the
        state it holds and its optimizer (None: unknown); None for a Hugging Face folder or none."""
        init_from = self.settings.trainer.init_from
        source = init_from and theseus_checkpoint(Path(init_from))
        if not source:
            return None
        checkpoints, run = Checkpointer.at(source), run_of(source)
        optimizer = chosen(read_saved(run / ".hydra" / "config.yaml"), "optimizer") if run else None
        return checkpoints, checkpoints.saved_layout(checkpoints.requested_step), optimizer

    def _check_init_from(self) -> None:
        """ConfigError when ``trainer.init_from`` (a theseus checkpoint) cannot start this run:
        another optimizer's state asked for, a parameter of another shape (before compiling)."""
        source = self._init_source()
        if source is None:
            return
        _, layout, optimizer = source
        s = self.settings.trainer
        problem = init_from_problem(s.init_from, optimizer, self.settings.optimizer.name, s.init_optimizer,
                                    path_shapes(layout["params"]),
                                    path_shapes(param_shapes(self.model, self.seq_len)))
        if problem:
            raise ConfigError(problem)

    def _check_memory(self) -> None:
        """Compile the step (kept for the run) and refuse one that does not fit the device."""
        if self._built is None:
            self._say_compiling()
        self._built = self._built or self.build()
        if self._built.memory:
            fit = self.fit(self._built.memory, compile_candidates=False)
            if not fit.fits:
                raise ConfigError(fit.problem())

    # -- building -------------------------------------------------------------------------

    def build(self, train: bool = True) -> Compiled:
        """Mesh, sharded state layout, and the eval step compiled ahead of time; with ``train``
        (not needed to evaluate a checkpoint) the train step too, with XLA's FLOPs and memory."""
        s = self.settings.trainer
        mesh = make_mesh(self.settings.mesh, self.devices)
        batch_share = (0, 1) if self.target else self.batch_share(mesh)  # a planned run reads no data
        tx, schedule = make_optimizer(self.settings.optimizer, s.max_steps)
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
        loss = jax.jit(functools.partial(eval_step, model=self.model, task=self.task), out_shardings=replicated)
        with jax.set_mesh(mesh), nn.logical_axis_rules(self.plan.rules()):
            options = compiler_options(self.devices)
            step = step.lower(target, tokens, key).compile(options) if train else None
            loss = loss.lower(target.params, eval_tokens).compile(options)
        measured = xla_flops(step) if train else None
        if measured is not None:  # XLA counts one device's share, and a scan's body once
            measured *= len(self.devices) * s.grad_accum
        memory = memory_report(step) if train else {}
        return Compiled(mesh, init, target, step, loss, measured, memory, batch_share)

    def batch_sharding(self, mesh: Mesh, accumulated: bool = False) -> NamedSharding:
        """Sequences split over (data, fsdp, expert); ``accumulated`` batches lead with grad_accum."""
        spec = PartitionSpec(None, BATCH_MESH_AXES, None) if accumulated else PartitionSpec(BATCH_MESH_AXES, None)
        return NamedSharding(mesh, spec)

    def peak(self) -> tuple[float, str]:
        dtype, given = self.model._activation_dtype, self.settings.trainer.peak_flops
        if self.target and given is None and self.target.peak(dtype):
            return self.target.peak(dtype), f"table: {self.target.chip.name}"
        return peak_flops(self.devices[0] if self.target else jax.local_devices()[0], dtype, given)

    # -- running --------------------------------------------------------------------------

    def dry_run(self) -> dict[str, Any]:
        """Build and compile, print parameters, FLOPs, memory and a step-time estimate; write nothing.
        With ``mesh.target``, also the predicted step on it. Returns the plan's summary (a sweep's row)."""
        self._say_compiling()
        seconds, compiled = _timed(self.build)
        peak, source = self.peak()
        abstract_params = compiled.target.params
        rows = self._describe(compiled, peak, source, n_params(abstract_params))
        rows.append(("step time at 100% MFU", _duration(self.flops_per_step / (peak * len(self.devices)))))
        rows.append(("compile time", _duration(seconds)))
        fit = self.fit(compiled.memory, seconds < ADVICE_COMPILE_BUDGET_S) if compiled.memory else None
        rows += fit.rows() if fit else []
        prediction = self.predict(compiled, peak) if self.target else None
        if prediction:
            rows += self._prediction_rows(prediction, peak)
        if jax.process_index() == 0:
            self.console.show_table(f"theseus dry run for {self.target.name}" if self.target else "theseus dry run",
                                    rows)
        if fit and not fit.fits:
            self._say(fit.message())
        return {"target": self.target.name if self.target else None, "fits": fit.fits if fit else None,
                "memory": fit.needed if fit else None, "limit": fit.limit if fit else None,
                "step_s": prediction.step_s if prediction else None,
                "chip_hours": self._chip_hours(prediction.step_s) if prediction else None}

    def _chip_hours(self, step_s: float) -> float:
        return step_s * self.settings.trainer.max_steps * len(self.devices) / self.target.per_chip / 3600

    def predict(self, compiled: Compiled, peak: float) -> Prediction:
        """The roofline of the step on the target's devices (see ``theseus.training.predict``)."""
        flops = max(self.flops_per_step, compiled.xla_flops or 0) / len(self.devices)
        return predict(compiled.step, flops_per_device=flops, peak=peak, hbm_bandwidth=self.target.hbm_bandwidth,
                       interconnect=self.target.interconnect, memory=compiled.memory,
                       loop_trips=self.settings.trainer.grad_accum)

    def _prediction_rows(self, p: Prediction, peak: float) -> list[tuple[str, str]]:
        step = p.step_s
        mfu = self.flops_per_step / (step * peak * len(self.devices))
        return [
            ("predicted: compute / step", f"{_duration(p.compute_s)} (FLOPs at peak)"),
            ("predicted: memory / step", f"{_duration(p.memory_s)} (HBM bytes {p.bytes_source}, "
                                         f"{format_si(self.target.hbm_bandwidth, 'B/s')})"),
            ("predicted: collectives / step", f"{_duration(p.collective_s)} ({format_bytes(p.sent)} sent per device "
                                              f"at {format_si(self.target.interconnect, 'B/s')})"),
            ("predicted: step time", f"{_duration(step)} ({p.bound}-bound; roofline, collectives not overlapped)"
             + (f"; XLA's estimate {_duration(p.xla_optimal_s)}" if p.xla_optimal_s else "")),
            ("predicted: tokens / s", format_si(self.tokens_per_step / step)),
            ("predicted: MFU", f"{mfu:.1%}"),
            ("predicted: chip-hours",
             f"{self._chip_hours(step):.3g} for trainer.max_steps={self.settings.trainer.max_steps}"),
        ]

    def fit(self, memory: dict[str, int], compile_candidates: bool) -> Fit:
        """Whether the step (XLA ``memory`` per device) fits the device (``trainer.memory_limit``
        overrides its size); with ``compile_candidates``, the settings advised are compiled first."""
        s = self.settings.trainer
        limit, source = ((s.memory_limit, "trainer.memory_limit") if s.memory_limit
                         else (int(self.target.hbm), f"{self.target.chip.name} HBM") if self.target
                         else device_memory(jax.local_devices()[0]))
        remat = getattr(self.model, "remat", None)

        def compile_memory(key: str, value: int | str) -> dict[str, int]:
            cfg = self.composed.copy()
            OmegaConf.update(cfg, key, value, force_add=True)
            return Trainer(cfg).build().memory

        return check_fit(memory, limit, source, batch_size=s.batch_size, grad_accum=s.grad_accum,
                         parallel=self.batch_parallel, remat=remat,
                         compile_memory=compile_memory if compile_candidates else None)

    def run(self, run_dir: Path) -> float:
        """Train to ``trainer.max_steps``, resuming from checkpoints; returns the final val loss.

        What the console shows is also written to ``run_dir/run.log``. SIGINT or SIGTERM stops
        the run after the step under way, with a checkpoint (a second one exits at once).
        """
        self.check_run_dir(run_dir)
        main = jax.process_index() == 0
        with self.console.transcript(run_dir / "run.log") if main else contextlib.nullcontext(), \
                Preemption(self._stop_step, say=self._say) as preemption:
            self._say(f"theseus: run directory {run_dir}")
            loop = self.start(run_dir)
            loop.preemption, preemption.step = preemption, loop.step
            hooks = self.hooks()
            with loop.logger:
                if loop.step >= loop.last_step:
                    loop.logger.message(f"{run_dir} is complete at step {loop.step}: nothing to train")
                    self._validate_now(loop, record=False)
                while loop.step < loop.last_step and not loop.stop:
                    self.take_step(loop)
                    with loop.window.pause():  # the hooks' time is not step time
                        for hook in hooks:
                            hook(loop)
                loop.profiler.close(loop.state)
                loop.checkpointer.wait()
                loop.checkpointer.close()
                if loop.evaluation is not None:
                    loop.logger.summary(final_val_loss=loop.val_loss)
                loop.logger.summary(status="interrupted" if loop.stop else "complete")
            if main:
                self._report_end(loop)
        if loop.stop:
            raise SystemExit(128 + loop.stop)  # the shell's code for a process ended by that signal
        return loop.val_loss

    def _stop_step(self, step: int) -> int:
        """The step a run stops after when signalled while step ``step + 1`` is under way: that
        one, or with several processes the next log step (where the signals are compared)."""
        if jax.process_count() == 1:
            return step + 1
        every = self.settings.trainer.log_every
        return min(self.settings.trainer.max_steps, (step // every + 1) * every)

    def start(self, run_dir: Path) -> LoopState:
        """Compile, restore the state (a checkpoint or a fresh init) and the loader, open the
        logger with the run's summary: the loop before its first step."""
        s = self.settings.trainer
        compiled, self._built = self._built or self.build(), None
        checkpointer = Checkpointer(run_dir / "checkpoints", s.keep_checkpoints)
        state, start, loader_state = self._restore(checkpointer, compiled)
        index, count = compiled.batch_share
        loader = self.dataset.loader("train", self.seq_len, s.batch_size // count, seed=self.settings.data.seed,
                                     process_index=index, process_count=count, prefetch=self.prefetch)
        if loader_state is not None:
            loader.set_state(loader_state)
        peak, source = self.peak()
        if jax.process_index() == 0:
            self.console.show_table("theseus run", self._describe(compiled, peak, source, n_params(state.params)))
        logger = RunLogger(self.logging, run_dir, resolved_config=self.resolved, total_steps=s.max_steps,
                           start_step=start, is_main=jax.process_index() == 0, record=self.console.record)
        logger.summary(**self._summary(compiled, peak, source, n_params(state.params)))
        return LoopState(run_dir, compiled, state, loader, logger, checkpointer, jax.random.key(s.seed + 1), peak,
                    step=start, last_step=s.max_steps,
                    profiler=Profiler(s.profile_steps, run_dir / "profile", report=self._say))

    def hooks(self) -> list[Hook]:
        """What runs after every step, in order; each acts on its own cadence. ``log`` comes
        first: the window it closes ends when its last step has finished."""
        return [self.log, self.preempt, self.validate, self.checkpoint]

    def take_step(self, loop: LoopState) -> None:
        """One optimizer step on the loader's next batch (dispatched: nothing waits for it)."""
        loop.profiler.on_step(loop.step + 1, loop.state)
        tokens = self._global_batch(next(loop.loader), loop.compiled.mesh)
        loop.state, loop.metrics = loop.compiled.step(loop.state, tokens, loop.dropout_key)
        loop.step += 1
        loop.window.add(loop.metrics["loss"], loop.loader.last_wait)

    def log(self, loop: LoopState) -> None:
        """Every ``trainer.log_every`` steps: log the window's metrics."""
        if loop.due(self.settings.trainer.log_every):
            self.log_window(loop)

    def log_window(self, loop: LoopState) -> dict[str, float]:
        """Log the metrics of the steps since the last log (``loss``: their mean; lr, grad_norm:
        the last step's; throughput from the mean step time), then stop on a NaN/Inf."""
        metrics = loop.window.close(loop.metrics)
        metrics.update(throughput(metrics["step_time"], self.tokens_per_step, self.flops_per_step, loop.peak,
                                  jax.device_count()))
        loop.logger.log(loop.step, metrics)
        loop.logged = metrics
        self._check_finite(loop.state, loop.checkpointer)
        return metrics

    def preempt(self, loop: LoopState) -> None:
        """Agree on a stop signal (compared across processes at log steps only)."""
        loop.stop = loop.preemption.agreed(loop.step, now=loop.due(self.settings.trainer.log_every))

    def validate(self, loop: LoopState) -> None:
        """Every ``trainer.eval_every`` steps: the validation loss, logged with the task's metrics."""
        loop.evaluated = loop.due(self.settings.trainer.eval_every)
        if loop.evaluated:
            self._validate_now(loop, record=True)

    def _validate_now(self, loop: LoopState, record: bool) -> None:
        """Evaluate the current params and show the numbers; ``record``: also log them."""
        metrics = self.evaluation_metrics(loop.compiled, loop.state.params)
        loop.val_loss, loop.evaluation = metrics["val_loss"], (loop.step, metrics)
        if record:
            loop.logger.log(loop.step, metrics, progress=False)
        loop.logger.message(evaluation_line(loop.step, metrics))

    def checkpoint(self, loop: LoopState) -> None:
        """Every ``trainer.checkpoint_every`` steps, and when stopping: save (asynchronously)."""
        if loop.due(self.settings.trainer.checkpoint_every) or loop.stop:
            self._check_finite(loop.state, loop.checkpointer)
            loop.checkpointer.save(loop.step, loop.state, loop.loader.get_state(), self.resolved,
                                   loop.val_loss if loop.evaluated else None)

    def _report_end(self, loop: LoopState) -> None:
        """The session's summary table, then the commands that go on from the run."""
        run_dir, step = loop.run_dir, loop.step
        kept = loop.checkpointer.steps()
        if loop.stop:
            status = (f"interrupted by {signal.Signals(loop.stop).name} after step {step}/{loop.last_step}; "
                      f"checkpoint {step} saved")
        else:
            status = f"complete: step {step}/{loop.last_step}"
        rows = [("status", status), ("run directory", str(run_dir))]
        if "loss" in loop.logged:
            rows.append(("train loss", f"{loop.logged['loss']:.4f} (last logged window)"))
        if loop.evaluation is not None:
            at, metrics = loop.evaluation
            rows.append(("val_loss", f"{metrics['val_loss']:.4f} at step {at}"))
        if "tokens_per_s" in loop.logged:
            rows.append(("throughput", f"{format_si(loop.logged['tokens_per_s'])} tokens/s, "
                                       f"MFU {100 * loop.logged['mfu']:.1f}% (last logged window)"))
        rows.append(("wall time", format_duration(time.perf_counter() - loop.began)))
        rows.append(("checkpoints", ", ".join(map(str, kept)) or "none"))
        self.console.show_table("theseus run summary", rows)
        lines = [f"  resume:   {resume_command()}"] if loop.stop else []
        if kept:
            extendable = self.settings.optimizer.schedule in ("constant", "wsd")  # wsd: before its decay
            more = (command_line(("trainer.max_steps=", "hydra.run.dir="), [f"hydra.run.dir={run_dir}"])
                    if extendable else
                    command_line(("trainer.max_steps=", "hydra.run.dir=", "trainer.init_from="),
                                 [f"trainer.init_from={run_dir}", f"hydra.run.dir={run_dir}-more"]))
            lines += [f"  sample:   python -m theseus.sample {run_dir} --prompt \"...\"",
                      f"  evaluate: python -m theseus.evaluate {run_dir}",
                      f"  export:   python -m theseus.export {run_dir} {run_dir}-hf",
                      f"  continue: {more} trainer.max_steps=N"]
        sync = sync_command(run_dir)
        if sync:
            lines.append(f"  W&B:      {sync}")
        if lines:
            self.console.show("next:\n" + "\n".join(lines))

    def _check_finite(self, state: TrainState, checkpointer: Checkpointer) -> None:
        """Stop (TrainingError) once a step's loss or gradients were NaN/Inf, unless skipping them."""
        first = int(state.first_nonfinite)
        if first and not self.settings.trainer.skip_nonfinite:
            checkpointer.wait()
            kept = checkpointer.steps()
            last = f"the last good checkpoint is step {kept[-1]}" if kept else "no checkpoint was written"
            raise TrainingError(f"the loss or gradients became NaN/Inf at step {first}; stopped ({last}). "
                                f"Lower optimizer.lr or raise optimizer.warmup_steps, or set "
                                f"trainer.skip_nonfinite=true to skip such updates")

    def _restore(self, checkpointer: Checkpointer, compiled: Compiled) -> tuple[TrainState, int, dict | None]:
        """The state to start from: a checkpoint (per ``trainer.resume``) or a fresh one."""
        resume = self.settings.trainer.resume
        source = checkpointer if resume in ("auto", "last", "never") else Checkpointer.at(Path(resume))
        restored = source.restore(compiled.target, step=source.requested_step, report=self._say)
        if restored is None:
            return self._fresh_state(compiled)
        state, loader_state, _config, step = restored
        self._say(f"resuming from {source.directory / str(step)} at step {step}")
        return state, step, loader_state

    def _fresh_state(self, compiled: Compiled) -> tuple[TrainState, int, dict | None]:
        """A new state at step 0: initialised, or with ``trainer.init_from``'s weights.

        From a theseus checkpoint: its params and, with ``trainer.init_optimizer``, its
        optimizer state (the schedule's own count reset: the new run's schedule starts at 0),
        with ``trainer.init_data`` its data position. From a Hugging Face folder: its weights,
        loaded onto their shards after the initialised params are dropped.
        """
        s = self.settings.trainer
        state = compiled.init()
        if s.init_from is None:
            return state, 0, None
        path = Path(s.init_from).expanduser()
        source = self._init_source()
        if source is None:
            self._say(f"starting from the weights of {path}")
            state = state.replace(params=None)
            return state.replace(params=load_params(path, arch_of(self.model), compiled.target.params)), 0, None
        checkpoints, layout, optimizer = source  # checked by check_run_dir
        target = compiled.target
        if optimizer not in (None, self.settings.optimizer.name):  # another optimizer's state: read, then dropped
            replicated = NamedSharding(compiled.mesh, PartitionSpec())
            target = target.replace(opt_state=jax.tree.map(
                lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=replicated), layout["opt_state"]))
        restored = checkpoints.restore(target, step=checkpoints.requested_step, report=self._say)
        if restored is None:
            raise ConfigError(f"trainer.init_from={s.init_from}: no readable checkpoint there")
        other, loader_state, _config, step = restored
        parts = ["weights", *(["optimizer state"] if s.init_optimizer else []),
                 *(["data position"] if s.init_data else [])]
        self._say(f"starting from the {', '.join(parts)} of {checkpoints.directory / str(step)}")
        state = state.replace(params=other.params)
        if s.init_optimizer:
            state = state.replace(opt_state=restart_schedule(other.opt_state))
        return state, 0, loader_state if s.init_data else None

    def batch_share(self, mesh: Mesh) -> tuple[int, int]:
        """``(index, count)``: this process reads share ``index`` of ``count`` equal, contiguous
        shares of every batch, the sequences its devices hold under the batch sharding.

        ``count`` is the number of processes when the batch's mesh axes split it across them;
        processes whose devices hold the same sequences (a tensor axis spanning hosts) read the
        same share.
        """
        s = self.settings.trainer
        micro = s.batch_size // s.grad_accum
        held = {(rows.start or 0, micro if rows.stop is None else rows.stop)
                for rows, *_ in self.batch_sharding(mesh).addressable_devices_indices_map((micro, 1)).values()}
        first, end = min(start for start, _ in held), max(stop for _, stop in held)
        if sum(stop - start for start, stop in held) != end - first or first % (end - first):
            raise ConfigError(f"process {jax.process_index()}'s devices hold sequences {sorted(held)} of each "
                              f"batch of {micro}, not one contiguous share: give mesh.data x mesh.fsdp x mesh.expert "
                              f"a multiple of the {jax.process_count()} processes, or make it 1")
        return first // (end - first), micro // (end - first)

    def _global_batch(self, host: np.ndarray, mesh: Mesh) -> jax.Array:
        """This process's ``[local_batch, seq + 1]`` tokens as one global, sharded array."""
        s = self.settings.trainer
        local = host.reshape(s.grad_accum, -1, host.shape[-1])
        shape = (s.grad_accum, s.batch_size // s.grad_accum, host.shape[-1])
        return on_devices(local, self.batch_sharding(mesh, accumulated=True), shape)

    def evaluation_metrics(self, compiled: Compiled, params: Any) -> dict[str, float]:
        """Every evaluation's metrics (``val_loss``, per source, multiple-choice tasks) on
        ``trainer.eval_batches`` batches of each validation split (the same each time): the
        loop's, and ``python -m theseus.evaluate``'s of a checkpoint."""
        s = self.settings.trainer
        return evaluate(params, self.evaluations, loss=compiled.eval_step, val_metrics=self.task.val_metrics,
                        sharding=self.batch_sharding(compiled.mesh), rules=self.plan.rules(),
                        share=compiled.batch_share, batch_size=s.batch_size // s.grad_accum, batches=s.eval_batches)

    def _summary(self, compiled: Compiled, peak: float, source: str, params: int) -> dict[str, Any]:
        """What the run records about itself, the FLOPs convention included."""
        analytic = self.flops_per_step
        ratio = compiled.xla_flops / analytic if compiled.xla_flops else None
        if ratio is not None and abs(ratio - 1) > 0.25:
            self._say(f"warning: analytic FLOPs/step {analytic:.3e} differ from XLA's {compiled.xla_flops:.3e} "
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
             + f" = {len(self.devices)} x {self.devices[0].device_kind}"
             + (f" on {self.target.process_count} hosts" if self.target and self.target.process_count > 1 else "")),
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


def restart_schedule(opt_state: Any) -> Any:
    """``opt_state`` with every learning-rate schedule's step count at 0 (the moments kept)."""
    def reset(node: Any) -> Any:
        return node._replace(count=jax.numpy.zeros_like(node.count)) if isinstance(node, ScaleByScheduleState) else node

    return jax.tree.map(reset, opt_state, is_leaf=lambda node: isinstance(node, ScaleByScheduleState))


def command_line(drop: tuple[str, ...] = (), add: Sequence[str] = ()) -> str:
    """This process's ``python -m theseus.run`` command line, less the arguments starting with
    one of ``drop`` (and any ``trainer.resume``), plus ``add``."""
    kept = [arg for arg in sys.argv[1:] if not arg.startswith((*drop, "trainer.resume="))]
    return " ".join(["python -m theseus.run", *kept, *add])


def resume_command() -> str:
    """The command line that continues this run: the same one, given ``hydra.run.dir``, or with
    ``trainer.resume=last`` (which finds the newest run it can continue)."""
    given = any(arg.startswith("hydra.run.dir=") for arg in sys.argv[1:])
    return command_line(add=[] if given else ["trainer.resume=last"])


def _duration(seconds: float) -> str:
    """A short span in the unit that reads best: ``2.31 ms``, ``4.5 s``, ``13m05s``."""
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s" if seconds < 60 else format_duration(seconds)


def _timed(fn):
    """``(seconds, fn())``."""
    began = time.perf_counter()
    result = fn()
    return time.perf_counter() - began, result
