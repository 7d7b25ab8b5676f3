"""Trainer settings: steps, batch, evaluation, checkpoints, resume."""

from __future__ import annotations

import dataclasses

from theseus.config import ConfigError, Configurable, field


@dataclasses.dataclass(frozen=True)
class TrainerConfig(Configurable):
    max_steps: int = field("trainer.max_steps", default=1000, help="optimizer steps to train")
    batch_size: int = field("trainer.batch_size", default=32, help="global sequences per optimizer step")
    grad_accum: int = field("trainer.grad_accum", default=1, help="micro-batches accumulated per step")
    log_every: int = field("trainer.log_every", default=10, help="steps between logged metrics", resumable=True)
    eval_every: int = field("trainer.eval_every", default=200, help="steps between evaluations; 0: only at the end",
                            resumable=True)
    eval_batches: int = field("trainer.eval_batches", default=10, help="validation batches per evaluation",
                              resumable=True)
    checkpoint_every: int = field("trainer.checkpoint_every", default=500, help="steps between checkpoints; 0: only at the end",
                                  resumable=True)
    keep_checkpoints: int = field("trainer.keep_checkpoints", default=3, help="most recent checkpoints kept (plus the best)",
                                  resumable=True)
    resume: str = field("trainer.resume", default="auto",
                        help="auto: continue this run directory; last: continue the newest run under outputs/ "
                             "that this command can continue; never: refuse a used one; or a checkpoint path",
                        resumable=True)
    seed: int = field("trainer.seed", default=0, help="seed of parameter init and dropout")
    dry_run: bool = field("trainer.dry_run", default=False, help="build and compile, print memory and FLOPs, then exit",
                          resumable=True)
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
    peak_flops: float | None = field("trainer.peak_flops", default=None, help="peak FLOP/s per device for MFU; unset: table or measured",
                                     resumable=True)
    memory_limit: int | None = field("trainer.memory_limit", default=None,
                                     help="bytes per device the dry run checks the step against; unset: the device's",
                                     resumable=True)
    profile_steps: list[int] | None = field("trainer.profile_steps", default=None,
                                            help="[START, END]: write a jax.profiler trace of these steps to RUN/profile/",
                                            resumable=True)

    def __post_init__(self):
        """Counts within range, so a bad value fails before a run starts."""
        for key in ("max_steps", "batch_size", "grad_accum", "log_every", "eval_batches", "keep_checkpoints"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"trainer.{key} must be positive, got {getattr(self, key)}")
        for key in ("eval_every", "checkpoint_every"):
            if getattr(self, key) < 0:
                raise ConfigError(f"trainer.{key} must be 0 (only at the end) or positive, got {getattr(self, key)}")
        if self.peak_flops is not None and not self.peak_flops > 0:
            raise ConfigError(f"trainer.peak_flops must be positive FLOP/s per device (or null: from the table "
                              f"or measured), got {self.peak_flops}")
        if self.memory_limit is not None and self.memory_limit <= 0:
            raise ConfigError(f"trainer.memory_limit must be positive bytes per device (or null: the device's), "
                              f"got {self.memory_limit}")
        steps = self.profile_steps
        if steps is not None and (len(steps) != 2 or not 1 <= steps[0] <= steps[1]):
            raise ConfigError(f"trainer.profile_steps must be [START, END] with 1 <= START <= END (the steps "
                              f"to trace), got {list(steps)}")
        if not self.resume:
            raise ConfigError("trainer.resume is empty: set it to auto, last, never or a checkpoint path")
