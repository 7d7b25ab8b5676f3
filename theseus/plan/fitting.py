"""What fits: for a step that does not fit its device, the smallest change of its settings that
does, compiled before it is named.

The knobs trade memory for speed: ``trainer.grad_accum`` (the batch in more micro-batches: no
more FLOPs, smaller matrix products), sharding the state over the batch's devices
(``mesh.fsdp``: data parallelism made fully sharded, at the cost of collectives), and
``architecture.remat`` (``dots``, then ``full``: activations recomputed). ``candidates`` lists
their combinations by how many knobs each turns. ``smallest_fit`` walks them, fewest knobs
first: a change whose parameters, optimizer state and gradients alone are over the limit is
passed over (its layout traced, nothing compiled); the others are compiled quietly, at most
``trainer.fit_candidates`` of them. Of the changes of the first count that has one that fits,
the one with the best ``score`` (a target's predicted MFU) is named; without a score, the first.

    found = smallest_fit(cfg, assemble, layout, limit, needed, budget=4, score=mfu)
    found.fit        # (change, its compiled run) of the one named, or None
    found.advice()   # "trainer.grad_accum=8 mesh.fsdp=8 fits (compiled: 10.3 GiB per device, ...)"
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
from omegaconf import DictConfig

from theseus.base.compile_oom import DoesNotFit
from theseus.config import ConfigError
from theseus.config.compose import with_values
from theseus.model.lora import trainable
from theseus.plan.memory import REMAT_ORDER, accumulation
from theseus.training.metrics import format_bytes
from theseus.training.parts import Run
from theseus.training.state import bytes_per_device

Change = dict[str, Any]  # config key -> value


def candidates(*, batch_size: int, grad_accum: int, parallel: int, data: int, fsdp: int, data_given: bool,
               remat: str | None, fixed: int, temp: int, limit: int) -> list[list[Change]]:
    """The changes to try: every combination of the knobs (at most one remat policy in each),
    those of one knob, then of two, ...; within a count, in the knobs' order (accumulation,
    sharding, remat ``dots``, ``full``).

    ``batch_size`` splits over ``parallel`` devices and ``grad_accum`` micro-batches; the mesh
    has ``data`` x ``fsdp`` of them (``data_given``: ``mesh.data`` set, not -1); ``remat`` is
    the model's policy (None: no such key). Of the step's bytes per device, ``temp`` is taken to
    scale with the micro-batch and ``fixed`` not: the accumulation tried is the smallest
    estimated to fit in ``limit``, else the most the batch allows (``memory.accumulation``).
    """
    knobs: list[Change] = []
    accum, _ = accumulation(batch_size, grad_accum, parallel, fixed, temp, limit)
    if accum is not None:
        knobs.append({"trainer.grad_accum": accum})
    if data > 1:
        knobs.append({**({"mesh.data": 1} if data_given else {}), "mesh.fsdp": data * fsdp})
    if remat is not None:
        knobs += [{"architecture.remat": policy} for policy in REMAT_ORDER[REMAT_ORDER.index(remat) + 1:]]
    levels = [[{key: value for knob in combination for key, value in knob.items()}
               for combination in itertools.combinations(knobs, n)
               if sum("architecture.remat" in knob for knob in combination) <= 1]
              for n in range(1, len(knobs) + 1)]
    return [level for level in levels if level]


def text(change: Change) -> str:
    """``mesh.fsdp=8 architecture.remat=full``: a change as the overrides that make it."""
    return " ".join(f"{key}={value}" for key, value in change.items())


@dataclass
class Found:
    """What ``smallest_fit`` found: ``fits``, ``(change, its compiled run, score)`` of each change
    of the fewest knobs that fits, the one named first; ``tried``, ``(change, bytes per device)``
    of each compiled over the limit; ``passed_over``, the changes whose parameters, optimizer
    state and gradients alone are over it; ``left``, those the budget left uncompiled;
    ``seconds``, the compiles'."""

    fits: list[tuple[Change, Run, float | None]] = field(default_factory=list)
    tried: list[tuple[Change, int]] = field(default_factory=list)
    passed_over: int = 0
    left: int = 0
    seconds: float = 0.0

    @property
    def fit(self) -> tuple[Change, Run] | None:
        return self.fits[0][:2] if self.fits else None

    def advice(self) -> str:
        """The fix in words: the change named, with its memory and score (the predicted MFU);
        else what was compiled over the limit, and what is left."""
        tried = "; ".join(f"{text(change)}: {format_bytes(total)}" for change, total in self.tried)
        compiled = len(self.tried) + len(self.fits)
        took = f" ({compiled} compiled in {self.seconds:.0f} s)" if compiled else ""
        if self.fits:
            (change, run, score), *others = self.fits
            return (f"{text(change)} fits ({_fitted(run, score)})"
                    + "".join(f"; so does {text(c)} ({_fitted(r, s)})" for c, r, s in others)
                    + (f"; over it: {tried}" if tried else "") + took)
        said = [f"compiled over the limit: {tried}"] if tried else []
        if self.passed_over:
            said.append(f"{self.passed_over} other change(s) hold more than that in parameters, optimizer state and "
                        f"gradients alone")
        if self.left:
            said.append(f"{self.left} not compiled (raise trainer.fit_candidates to try them)")
        return "; ".join(said) + took + (": " if said else "") + (
            "lower trainer.batch_size or architecture.seq_len, or plan for more devices (mesh.target)")


def _fitted(run: Run, score: float | None) -> str:
    return (f"compiled: {format_bytes(run.compiled.memory['total'])} per device"
            + (f", predicted MFU {score:.1%}" if score is not None else ""))


def smallest_fit(cfg: DictConfig, assemble: Callable[..., Run], layout: Run, limit: int, needed: int,
                 budget: int, score: Callable[[Run], float | None] = lambda run: None) -> Found:
    """The changes of ``candidates`` with the fewest knobs whose steps fit in ``limit`` bytes per
    device, the best ``score(run)`` first, compiling at most ``budget`` changes. ``layout``:
    ``cfg``'s run assembled without steps (its settings, mesh and state's layout); ``needed``:
    the bytes per device its step needs."""
    s, shape = layout.settings, layout.mesh_shape
    floor = floor_bytes(layout)
    levels = candidates(batch_size=s.trainer.batch_size, grad_accum=s.trainer.grad_accum,
                        parallel=layout.batch_parallel, data=shape["data"], fsdp=shape["fsdp"],
                        data_given=s.mesh.data != -1, remat=getattr(layout.model, "remat", None), fixed=floor,
                        temp=max(needed - floor, 0), limit=limit)
    found = Found()
    for level in levels:
        for change in level:
            changed = with_values(cfg, change)
            try:
                least = floor_bytes(assemble(changed, steps=None, announce=False)) if _reshards(change) else floor
            except ConfigError:  # a change this run cannot take (a mesh its devices do not divide into)
                continue
            if least > limit:
                found.passed_over += 1
            elif len(found.tried) + len(found.fits) == budget or found.fits and found.fits[0][2] is None:
                found.left += 1
            else:
                _compile(found, change, changed, assemble, limit, score)
        if found.fits:
            found.fits.sort(key=lambda fit: -(fit[2] or 0.0))  # stable: the first of equal scores stays first
            return found
    return found


def _compile(found: Found, change: Change, changed: DictConfig, assemble: Callable[..., Run], limit: int,
             score: Callable[[Run], float | None]) -> None:
    """Compile ``changed`` (``cfg`` with ``change``): into ``found.fits`` or ``found.tried``."""
    began = time.perf_counter()
    try:
        run = assemble(changed, announce=False)
        total = run.compiled.memory["total"]
    except DoesNotFit as exc:
        run, total = None, exc.oom.needed
    found.seconds += time.perf_counter() - began
    if run is not None and total <= limit:
        found.fits.append((change, run, score(run)))
    else:
        found.tried.append((change, total))


def floor_bytes(run: Run) -> int:
    """The least a train step of ``run``'s layout holds on one device, whatever its activations:
    its parameters and optimizer state, and the gradients of the parameters it trains."""
    params = run.compiled.target.params
    trained = [leaf for leaf, train in zip(jax.tree.leaves(params), jax.tree.leaves(trainable(params))) if train]
    return bytes_per_device(params) + bytes_per_device(run.compiled.target.opt_state) + bytes_per_device(trained)


def _reshards(change: Change) -> bool:
    return any(key.startswith("mesh.") for key in change)

