"""The trainer: the loop over an assembled ``Run`` (``theseus.recipe.assemble``).

``Trainer(run).run(run_dir)`` restores the state (the run directory's checkpoint, else the
run's start: fresh, or ``trainer.init_from``'s, whose weights are evaluated first: the curve's
step 0), then takes steps; after each, the hooks ``log``, ``preempt``, ``evaluate`` and
``checkpoint`` run, each on its own cadence. A new piece of cadence is one more hook (a
subclass overrides ``hooks``).
"""

from __future__ import annotations

import contextlib
import gc
from pathlib import Path

import jax

from theseus.tasks.task import BatchError
from theseus.training.batches import global_batch
from theseus.training.checkpoint import Checkpointer
from theseus.training.logger import RunLogger
from theseus.training.loop import Hook, LoopState
from theseus.training.metrics import throughput
from theseus.training.parts import Run
from theseus.training.preemption import Preemption
from theseus.training.profiler import Profiler
from theseus.training.console import TRANSCRIPT, RunConsole, evaluation_line, sample_line
from theseus.training.state import TrainState, n_params
from theseus.training.summary import describe, record, report_end


ROLLOUT = "rollout"  # the entry of a checkpoint's data state holding a rollout's


@contextlib.contextmanager
def _start_frozen():
    """What the run's start made lives on: a full collection in the loop (~0.1-0.2 s) skips it
    (``gc.freeze``), and collects it again once the loop is over, however it ends."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class TrainingError(RuntimeError):
    """A run that cannot go on (non-finite values, a batch its task cannot make): reported in one
    line, like a ConfigError."""


class Trainer:
    """Trains an assembled run: a step, then the hooks, until ``trainer.max_steps`` or a signal."""

    def __init__(self, run: Run):
        self.parts = run
        self.settings = run.settings.trainer
        self.console = RunConsole()  # what the run shows; its transcript is open while it runs

    def say(self, text: str) -> None:
        """A line on the console (and in the transcript), from process 0 only."""
        if jax.process_index() == 0:
            self.console.show(text)

    def run(self, run_dir: Path) -> float:
        """Train to ``trainer.max_steps``, resuming from checkpoints; returns the final val loss.

        What the console shows is also written to ``run_dir/run.log``. SIGINT or SIGTERM stops
        the run after the step under way, with a checkpoint (a second one exits at once).
        """
        main = jax.process_index() == 0
        with self.console.transcript(run_dir / TRANSCRIPT) if main else contextlib.nullcontext(), \
                Preemption(say=self.say) as preemption:
            self.say(f"theseus: run directory {run_dir}")
            loop = self.start(run_dir)
            loop.preemption, preemption.step = preemption, loop.step
            hooks = self.hooks()
            # the checkpointer closed however the loop ends: a save in flight is finished, not lost
            with loop.logger, _start_frozen(), contextlib.closing(loop.checkpointer):
                with self._stopping_on_batch_errors(loop, f"evaluating step {loop.step}"):
                    if loop.step >= loop.last_step:
                        loop.logger.message(f"{run_dir} is complete at step {loop.step}: nothing to train")
                        self._evaluate_now(loop, log=False)
                    elif loop.step == 0 and self.settings.init_from:
                        self._evaluate_now(loop, log=True)  # the baseline: the curve starts from the model given
                while loop.step < loop.last_step and not loop.stop:
                    with self._stopping_on_batch_errors(loop, f"making step {loop.step + 1}"):
                        self.take_step(loop)
                    with loop.window.pause(), self._stopping_on_batch_errors(loop, f"evaluating step {loop.step}"):
                        for hook in hooks:  # the hooks' time is not step time
                            hook(loop)
                loop.profiler.close(loop.state)
                loop.checkpointer.wait()  # a save that failed is reported; closing finishes one in flight
                if loop.evaluation is not None:
                    loop.logger.summary(final_val_loss=loop.val_loss)
                loop.logger.summary(status="interrupted" if loop.stop else "complete")
            if main:
                report_end(self.parts, loop, self.console)
        if loop.stop:
            raise SystemExit(128 + loop.stop)  # the shell's code for a process ended by that signal
        return loop.val_loss

    def start(self, run_dir: Path) -> LoopState:
        """Restore the state (this directory's checkpoint, or the run's start) and the loader,
        open the logger with the run's summary: the loop before its first step."""
        run, s = self.parts, self.settings
        checkpointer = Checkpointer(run_dir / "checkpoints", s.keep_checkpoints, base=run.base,
                                    writer=s.checkpoint_writer)
        state, step, loader_state = self._restore(checkpointer)
        if step < s.max_steps:  # steps to take, and so saves to make
            checkpointer.prepare(state)
        index, count = run.batch_share
        loader = run.dataset.loader("train", run.model.seq_len, s.batch_size // count, seed=run.settings.data.seed,
                                    process_index=index, process_count=count, prefetch=run.prefetch)
        if loader_state is not None:
            loader.set_state(loader_state)
            if run.rollout is not None:  # the completions it was reusing when the checkpoint was taken
                run.rollout.set_state(loader_state.get(ROLLOUT))
        params = n_params(state.params)
        if jax.process_index() == 0:
            self.console.show_table("theseus run", describe(run, params))
        logger = RunLogger(run.logging, run_dir, resolved_config=run.record, total_steps=s.max_steps,
                           start_step=step, is_main=jax.process_index() == 0, record=self.console.record)
        logger.summary(**record(run, params, self.say))
        return LoopState(run_dir, run.compiled, state, loader, logger, checkpointer, jax.random.key(s.seed + 1),
                         run.peak[0], step=step, last_step=s.max_steps,
                         profiler=Profiler(s.profile_steps, run_dir / "profile", report=self.say))

    def _restore(self, checkpointer: Checkpointer) -> tuple[TrainState, int, dict | None]:
        """``(state, step, loader state)``: a checkpoint (per ``trainer.resume``), else the run's start."""
        resume = self.settings.resume
        source = checkpointer if resume in ("auto", "last", "never") else Checkpointer.at(Path(resume), self.parts.base)
        restored = source.restore(self.parts.compiled.target, step=source.requested_step, report=self.say)
        if restored is None:
            state, loader_state = self.parts.start(self.parts.compiled, self.say)
            return state, 0, loader_state
        state, loader_state, _config, step = restored
        self.say(f"resuming from {source.directory / str(step)} at step {step}")
        return state, step, loader_state

    def hooks(self) -> list[Hook]:
        """What runs after every step, in order; each acts on its own cadence. ``log`` comes
        first: the window it closes ends when its last step has finished."""
        return [self.log, self.progress, self.preempt, self.evaluate, self.checkpoint]

    def take_step(self, loop: LoopState) -> None:
        """One optimizer step on the loader's next batch (dispatched: nothing waits for it), or on
        the batch the task's rollout makes with the current params (it waits for them)."""
        loop.profiler.on_step(loop.step + 1, loop.state)
        rollout = self.parts.rollout
        if rollout is None:
            batch, made = global_batch(next(loop.loader), loop.compiled.mesh, self.settings.batch_size,
                                       self.settings.grad_accum), {}
        else:
            batch, made = rollout.batch(loop.state.params, loop.loader, loop.step)
        loop.state, loop.metrics = loop.compiled.step(loop.state, batch, loop.dropout_key)
        loop.step += 1
        loop.window.add({**loop.metrics, **made}, loop.loader.last_wait)

    @contextlib.contextmanager
    def _stopping_on_batch_errors(self, loop: LoopState, doing: str):
        """A batch the task cannot make (a reward function that failed: ``BatchError``) stops the
        run in one line (TrainingError, saying what it was ``doing``), after a checkpoint of the
        last step taken."""
        position = loop.loader.get_state()  # before the step: a failed rollout has drawn its prompts
        try:
            yield
        except BatchError as exc:
            saved = ""
            if loop.step > 0:
                if loop.step not in loop.checkpointer.steps():
                    loop.checkpointer.save(loop.step, loop.state, self._data_state(loop, position), self.parts.record)
                loop.checkpointer.wait()
                saved = f"; checkpoint step {loop.step} saved: fix it and run the same command to resume"
            raise TrainingError(f"{exc} ({doing}){saved}") from exc

    def log(self, loop: LoopState) -> None:
        """Every ``trainer.log_every`` steps: log the metrics of the steps since the last log
        (each their mean, lr and grad_norm the last step's: ``LogWindow.close``; throughput
        from the mean step time), then stop on a NaN/Inf."""
        if not loop.due(self.settings.log_every):
            return
        run = self.parts
        metrics = loop.window.close()
        metrics.update(throughput(metrics["step_time"], run.tokens_per_step, run.flops_per_step, loop.peak,
                                  jax.device_count()))
        loop.logger.log(loop.step, metrics)
        loop.logged = metrics
        self._check_finite(loop.state, loop.checkpointer)

    def progress(self, loop: LoopState) -> None:
        """Between logged steps, with a live progress bar: move it to the last step the device
        has finished (asked without waiting for it: no host sync per step)."""
        if loop.window.steps and loop.logger.live:
            loop.logger.advance(loop.step - len(loop.window.steps) + loop.window.finished())

    def preempt(self, loop: LoopState) -> None:
        """Agree on a stop signal, every step (across processes: a flag all-reduced each step,
        read one step later)."""
        loop.stop = loop.preemption.agreed(loop.step)

    def evaluate(self, loop: LoopState) -> None:
        """Every ``trainer.eval_every`` steps: the validation loss, logged with the task's metrics."""
        loop.evaluated = loop.due(self.settings.eval_every)
        if loop.evaluated:
            self._evaluate_now(loop, log=True)

    def _evaluate_now(self, loop: LoopState, log: bool) -> None:
        """Evaluate the current params and show the numbers, and a few of the task's examples (a
        rollout's prompts, completions and rewards); ``log``: also log them."""
        metrics = self.parts.evaluate(loop.state.params)
        loop.val_loss, loop.evaluation = metrics["val_loss"], (loop.step, metrics)
        samples = self.parts.rollout.samples if self.parts.rollout is not None else []
        if log:
            loop.logger.log(loop.step, metrics, progress=False)
            loop.logger.samples(loop.step, samples)
        loop.logger.message(evaluation_line(loop.step, metrics))
        for sample in samples:
            loop.logger.message(sample_line(sample))

    def checkpoint(self, loop: LoopState) -> None:
        """Every ``trainer.checkpoint_every`` steps, and when stopping: save (asynchronously)."""
        if loop.due(self.settings.checkpoint_every) or loop.stop:
            self._check_finite(loop.state, loop.checkpointer)
            loop.checkpointer.save(loop.step, loop.state, self._data_state(loop), self.parts.record,
                                   loop.val_loss if loop.evaluated else None)

    def _data_state(self, loop: LoopState, position: dict | None = None) -> dict:
        """What a checkpoint keeps of the data: the loader's position (``position``: one taken
        before) and a rollout's state."""
        state = dict(position or loop.loader.get_state())
        if self.parts.rollout is not None:
            state[ROLLOUT] = self.parts.rollout.get_state()
        return state

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
