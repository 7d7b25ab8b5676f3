"""The base of every model source: what each kind answers, where the rest of theseus used to ask
which kind it had.

    source.path, source.given, source.key      # the absolute path; as given; the key that named it
    source.what, source.imported                # "a GGUF file"; weights from outside theseus
    source.init_from_values(cfg)                # {"architecture.n_layers": 4, ...}: what it determines in cfg
    source.load_params(arch, target)            # its weights on a params layout's shards
    source.start(compiled, say, how)            # (state, loader state): a new run's step 0 from it

A kind is a subclass naming itself (``class HFFolder(ImportedWeights, kind="hf")``): ``KINDS``
holds each, for ``parse_source`` to build the one a path holds.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import flax.linen as nn
from omegaconf import DictConfig

from theseus.sources.frozen_base import FrozenBase

TAKES = "a Hugging Face folder, a theseus run or checkpoint, a .gguf file or a model id in the local Hugging Face cache"
Say = Callable[[str], None]


class StateMaker(Protocol):
    """What a run's start needs of its compiled steps (``theseus.training.compiled.Compiled``):
    the mesh, the train state's layout, and the state made around params (None: initialised)."""

    mesh: Any
    target: Any  # the train state's layout: ShapeDtypeStructs with shardings

    def init(self, params: Any = None) -> Any: ...


@dataclasses.dataclass(frozen=True)
class StartFrom:
    """How a run starts from its ``trainer.init_from``: the run's architecture values
    (``hf_config.arch_of``), the seed of LoRA's fresh adapters, its optimizer's name, and
    whether that optimizer's state and the data position are taken too."""

    arch: Mapping[str, Any]
    seed: int
    optimizer: str
    init_optimizer: bool = False
    init_data: bool = False


KINDS: dict[str, type[ModelSource]] = {}


@dataclasses.dataclass(frozen=True)
class ModelSource(abc.ABC):
    """A model named by ``key`` (None: a command's PATH argument) as ``given``, at the absolute ``path``."""

    path: Path
    given: str
    key: str | None = "trainer.init_from"
    kind: ClassVar[str]  # "hf", "gguf", "run": ``KINDS``' name for it
    what: ClassVar[str]  # the kind in words, for messages
    imported: ClassVar[bool]  # weights from outside theseus, whose vocabulary is kept (import then export: identity)

    def __init_subclass__(cls, kind: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if kind is not None:
            cls.kind = kind
            KINDS[kind] = cls

    def __str__(self) -> str:
        return named(self.given, self.key)

    @property
    def run_dir(self) -> Path | None:
        """A theseus run's directory (the folder holding ``.hydra/``); None for another kind, or
        checkpoints copied without their run."""
        return None

    @property
    def step(self) -> int | None:
        """The checkpoint step the path names; None: the newest, or a kind without steps."""
        return None

    @property
    def base_path(self) -> Path:
        """What a LoRA run's checkpoints name as their base: the folder or file of the weights."""
        return self.path

    @abc.abstractmethod
    def model_choice(self) -> list[str]:
        """``["model=NAME"]``: the model it loads into, where no override picks one (``[]``: the default)."""

    @abc.abstractmethod
    def init_from_values(self, cfg: DictConfig) -> dict[str, Any]:
        """What it determines in ``cfg`` (whose ``trainer.init_from`` it is), as dotted keys and
        values: its architecture and tokenizer; ConfigError when it cannot start ``cfg``'s model."""

    @abc.abstractmethod
    def architecture(self) -> tuple[str, dict[str, Any]]:
        """``(model, values)``: the model it loads into and its ``architecture.*`` values."""

    def check_asked(self, init_optimizer: bool, init_data: bool) -> None:
        """ConfigError when ``trainer.init_optimizer`` or ``init_data`` asks it for what it lacks."""

    def check_start(self, how: StartFrom, model: nn.Module) -> None:
        """ConfigError when it cannot start a run of ``model`` as ``how`` says (a parameter of
        another shape, another optimizer's state), before anything compiles."""

    def check_reference(self, model: nn.Module) -> None:
        """ConfigError when, as a task's reference (``dpo.reference``), it lacks a parameter of
        ``model`` or holds one in another shape, before its weights are read."""

    @abc.abstractmethod
    def load_params(self, arch: Mapping[str, Any], target: Mapping, seed: int = 0) -> dict:
        """Its params laid out as ``target`` (ShapeDtypeStructs with shardings), cast to its dtypes;
        LoRA's adapters it lacks fresh (``lora.initial`` from ``seed``)."""

    @abc.abstractmethod
    def start(self, compiled: StateMaker, say: Say, how: StartFrom) -> tuple[Any, dict | None]:
        """``(state, loader state)``: a new run's state at step 0 from it (loader state None: the data's start)."""

    @abc.abstractmethod
    def config(self, overrides: Sequence[str] = ()) -> DictConfig:
        """The config that sample, evaluate and export load it with, ``KEY=VALUE`` ``overrides`` applied."""

    @abc.abstractmethod
    def trained_params(self, step: int | None, arch: Mapping[str, Any], target: Any,
                       base: FrozenBase | None = None) -> tuple[Any, int | None]:
        """``(params, step)`` laid out as ``target.params`` (the state's layout; ``base``: a LoRA
        run's ``FrozenBase``): ``step``'s, else the one it names, else its newest."""

    def adapter_base_problem(self) -> str | None:
        """Why peft cannot load adapters against it, as a hint to add to the refusal ("" for none);
        None: it can (a Hugging Face folder)."""
        return ""


def named(given: str, key: str | None) -> str:
    """How errors name a source: ``key=given``, or ``given`` alone (a command's argument)."""
    return given if key is None else f"{key}={given}"


def widths(values: dict[str, Any]) -> dict[str, Any]:
    """``architecture.*`` ``values`` with the widths a GPT derives where unset written out: d_ff
    (4 x d_model), n_kv_heads (n_heads), head_dim (d_model / n_heads)."""
    out, key = dict(values), "architecture.{}".format
    d, heads = out.get(key("d_model")), out.get(key("n_heads"))
    if isinstance(d, int) and isinstance(heads, int) and heads:
        for name, derived in (("d_ff", 4 * d), ("n_kv_heads", heads), ("head_dim", d // heads)):
            out[key(name)] = out.get(key(name)) or derived
    return out
