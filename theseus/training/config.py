"""Trainer settings: steps, batch, evaluation, checkpoints, resume."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from theseus.config import PLANNING, POSITIVE, SEED, ConfigError, Configurable, Range, field

CADENCE = Range(ge=0, says="0 (only at the end) or positive")  # steps between evaluations or checkpoints


@dataclasses.dataclass(frozen=True)
class TrainerConfig(Configurable):
    max_steps: int = field("trainer.max_steps", default=1000, check=POSITIVE, help="optimizer steps to train")
    batch_size: int = field("trainer.batch_size", default=32, check=POSITIVE, help="global sequences per optimizer step")
    grad_accum: int = field("trainer.grad_accum", default=1, check=POSITIVE, help="micro-batches accumulated per step")
    log_every: int = field("trainer.log_every", default=10, check=POSITIVE, help="steps between logged metrics",
                           resumable=True)
    eval_every: int = field("trainer.eval_every", default=200, check=CADENCE,
                            help="steps between evaluations; 0: only at the end", resumable=True)
    eval_batches: int = field("trainer.eval_batches", default=10, check=POSITIVE,
                              help="validation batches per evaluation", resumable=True)
    checkpoint_every: int = field("trainer.checkpoint_every", default=500, check=CADENCE,
                                  help="steps between checkpoints; 0: only at the end", resumable=True)
    keep_checkpoints: int = field("trainer.keep_checkpoints", default=3, check=POSITIVE,
                                  help="most recent checkpoints kept (plus the best)", resumable=True)
    checkpoint_writer: str = field("trainer.checkpoint_writer", default="auto", choices=("auto", "process", "threads"),
                                   help="who writes checkpoints: a process of their own (the loop pays one copy to "
                                        "host memory), or Orbax's threads beside the loop; auto: the process where "
                                        "one process drives an accelerator", resumable=True)
    resume: str = field("trainer.resume", default="auto",
                        help="auto: continue this run directory; last: continue the newest run under outputs/ "
                             "that this command can continue; never: refuse a used one; or a checkpoint path",
                        resumable=True)
    seed: int = field("trainer.seed", default=0, help="seed of parameter init and dropout", role=SEED)
    dry_run: bool = field("trainer.dry_run", default=False, help="build and compile, print memory and FLOPs, then exit",
                          resumable=True, role=PLANNING)
    plan_file: str | None = field("trainer.plan_file", default=None,
                                  help="with trainer.dry_run: write each point (its overrides, fit, memory, predicted "
                                       "step time and chip-hours) as a line of this JSONL file", resumable=True,
                                  role=PLANNING)
    fit_candidates: int = field("trainer.fit_candidates", default=4,
                                check=Range(ge=0, says="0 (name none) or more"), resumable=True, role=PLANNING,
                                help="a dry run whose step does not fit compiles at most this many changed settings "
                                     "(trainer.grad_accum, mesh.fsdp, architecture.remat; fewest changes first) and "
                                     "names the first that fits")
    skip_nonfinite: bool = field("trainer.skip_nonfinite", default=False,
                                 help="skip updates whose loss or gradients are NaN/Inf (counted) instead of stopping")
    init_from: str | None = field("trainer.init_from", default=None,
                                  help="start from the weights of a theseus run directory or checkpoint (its "
                                       "architecture), or of a local Hugging Face folder (config.json, "
                                       "safetensors; its architecture and tokenizer.json)")
    init_optimizer: bool = field("trainer.init_optimizer", default=False,
                                 help="with trainer.init_from a theseus checkpoint: also its optimizer state "
                                      "(the learning-rate schedule starts afresh)")
    init_data: bool = field("trainer.init_data", default=False,
                            help="with trainer.init_from a theseus checkpoint: also its data position (read on "
                                 "where it stopped)")
    peak_flops: float | None = field(
        "trainer.peak_flops", default=None,
        check=Range(gt=0, says="positive FLOP/s per device (or null: from the table or measured)"),
        help="peak FLOP/s per device for MFU; unset: table or measured", resumable=True)
    memory_limit: int | None = field("trainer.memory_limit", default=None,
                                     check=Range(gt=0, says="positive bytes per device (or null: the device's)"),
                                     help="bytes per device the dry run checks the step against; unset: the device's",
                                     resumable=True)
    profile_steps: list[int] | None = field("trainer.profile_steps", default=None,
                                            help="[START, END]: write a jax.profiler trace of these steps to RUN/profile/",
                                            resumable=True)

    def __post_init__(self):
        """Counts within range (the fields' own), the profiled steps in order, so a bad value fails
        before a run starts."""
        super().__post_init__()
        steps = self.profile_steps
        if steps is not None and (len(steps) != 2 or not 1 <= steps[0] <= steps[1]):
            raise ConfigError(f"trainer.profile_steps must be [START, END] with 1 <= START <= END (the steps "
                              f"to trace), got {list(steps)}")
        if steps is not None and steps[0] > self.max_steps:
            raise ConfigError(f"trainer.profile_steps={list(steps)} starts after the run's last step "
                              f"(trainer.max_steps={self.max_steps}): nothing would be traced; start it by step "
                              f"{self.max_steps}")
        if self.plan_file and not self.dry_run:
            raise ConfigError(f"trainer.plan_file={self.plan_file} is written by a dry run: add trainer.dry_run=true")
        if self.plan_file and not Path(self.plan_file).absolute().parent.is_dir():
            raise ConfigError(f"trainer.plan_file={self.plan_file}: its folder does not exist")
        if self.plan_file and Path(self.plan_file).is_dir():
            raise ConfigError(f"trainer.plan_file={self.plan_file} is a folder: give the file to write, e.g. "
                              f"trainer.plan_file={Path(self.plan_file) / 'plan.jsonl'}")
        if not self.resume:
            raise ConfigError("trainer.resume is empty: set it to auto, last, never or a checkpoint path")
        for key, asked in (("init_optimizer", self.init_optimizer), ("init_data", self.init_data)):
            if asked and not self.init_from:
                raise ConfigError(f"trainer.{key}=true takes it from trainer.init_from's checkpoint, which is unset: "
                                  f"set trainer.init_from=RUN_DIR or drop trainer.{key}")
