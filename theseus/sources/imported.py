"""Weights from outside theseus: a Hugging Face folder (``HFFolder``; a model id in the local hub
cache is one) or a GGUF file (``GGUFFile``).

    hf = source.hf_config()          # config.json's dict (a GGUF file's, from its metadata)
    with source.tensors() as tensors:
        wte = tensors.read("model.embed_tokens.weight")

A GGUF file is a Hugging Face model in another container: its metadata gives a config.json
dict, its tensors are read under Hugging Face's names, so every family's tables apply to it.

As ``trainer.init_from``, every ``architecture.*`` key that the config determines takes its
value; one given explicitly (an experiment file or the command line: a value other than its
field's default) that contradicts it is a ConfigError naming both, except
``architecture.seq_len``, which may be lowered (the position table is cut), and
``architecture.dropout``, which the config does not set. The vocabulary stays the checkpoint's
own ``vocab_size`` (not padded to a multiple of 128): import then export is the identity. Its
tokenizer (the folder's ``tokenizer.json``, the GGUF file's own) becomes ``data.tokenizer``
unless that was given explicitly. It holds weights alone: no optimizer state, no data position,
one set of weights (no checkpoint steps).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from theseus.config import ConfigError
from theseus.config.compose import compose
from theseus.config.registry import chosen, chosen_schema, model_class
from theseus.config.schema import flatten
from theseus.data.tokenizer import JSON_FILE, NAMES, ByteTokenizer, HFTokenizer
from theseus.interop import gguf
from theseus.interop.hf_config import CONFIG_FILE, architecture, format_of, read_config
from theseus.interop.hf_weights import Checkpoint
from theseus.interop.loading import Tensors, onto_layout
from theseus.model.models.gpt import GPT
from theseus.model.models.moe_gpt import MoEGPT
from theseus.sources.frozen_base import FrozenBase
from theseus.sources.in_config import KEY, model_choice
from theseus.sources.model_source import ModelSource, Say, StartFrom, StateMaker, widths


class ImportedWeights(ModelSource):
    """A Hugging Face model's weights and config.json, in a folder or a GGUF file."""

    imported = True

    @abc.abstractmethod
    def hf_config(self) -> dict[str, Any]:
        """The config.json it describes."""

    @abc.abstractmethod
    def where(self) -> str:
        """The file errors about its config name."""

    @abc.abstractmethod
    def tensors(self) -> Tensors:
        """A reader of its tensors by their Hugging Face names (``read(name)``, ``unused()``; a
        context manager); ConfigError when they are not there."""

    @abc.abstractmethod
    def tokenizer(self) -> str | None:
        """What ``data.tokenizer`` becomes for it (None: it has no tokenizer of its own)."""

    def model_choice(self) -> list[str]:
        try:
            return [f"model={format_of(self.hf_config()).model}"]
        except ConfigError:  # a broken config: init_from_values reports it
            return []

    def init_from_values(self, cfg: DictConfig) -> dict[str, Any]:
        flat = flatten(OmegaConf.to_container(cfg, resolve=True))
        hf = self.hf_config()
        arch = architecture(hf, where=self.where())
        self.tensors()  # its weights are there (safetensors, not pickle), before anything is written
        model = format_of(hf).model
        cls = model_class(cfg)
        if not issubclass(cls, GPT) or issubclass(cls, MoEGPT) != (model == "moe"):
            raise ConfigError(f"{self} is a Hugging Face {hf['model_type']} model, which loads into "
                              f"model={model}, but model={chosen(cfg, 'model')}: set model={model}")
        defaults = chosen_schema(cfg)
        values = {}
        for name, value in arch.items():
            key = f"architecture.{name}"
            current = flat.get(key)
            explicit = current != defaults[key].default
            if explicit and name == "seq_len" and current < value:
                continue  # a shorter context than the checkpoint's: allowed
            if explicit and current != value:
                raise ConfigError(f"{key}={current} contradicts {self}, whose config gives {key}={value}: "
                                  f"drop the override (the architecture follows the checkpoint)")
            values[key] = value
        tokenizer = flat["data.tokenizer"]
        if tokenizer == defaults["data.tokenizer"].default and self.tokenizer() is not None:
            tokenizer = values["data.tokenizer"] = self.tokenizer()
        size = _tokenizer_size(tokenizer)
        if size is not None and size > arch["vocab_size"]:
            raise ConfigError(f"data.tokenizer={tokenizer} has {size} tokens, more than the {arch['vocab_size']} rows "
                              f"of {self}: use the checkpoint's own tokenizer")
        return values

    def architecture(self) -> tuple[str, dict[str, Any]]:
        hf = self.hf_config()
        return format_of(hf, self.where()).model, widths({f"architecture.{key}": value for key, value in
                                                          architecture(hf, self.where()).items()})

    def check_asked(self, init_optimizer: bool, init_data: bool) -> None:
        for key, asked in (("init_optimizer", init_optimizer), ("init_data", init_data)):
            if asked:
                raise ConfigError(f"trainer.{key}=true: {self} holds weights alone (optimizer state and data "
                                  f"positions are a theseus checkpoint's): drop trainer.{key}")

    def load_params(self, arch: Mapping[str, Any], target: Mapping, seed: int = 0) -> dict:
        hf = self.hf_config()
        architecture(hf, self.where())  # refuses what theseus does not compute
        with self.tensors() as tensors:
            return onto_layout(hf, tensors, arch, target, self.given, self.where(), seed)

    def start(self, compiled: StateMaker, say: Say, how: StartFrom) -> tuple[Any, dict | None]:
        say(f"starting from the weights of {self.given}")
        return compiled.init(self.load_params(how.arch, compiled.target.params, how.seed)), None

    def config(self, overrides: Sequence[str] = ()) -> DictConfig:
        """The default config, ``trainer.init_from`` set to it (the model it loads into chosen
        unless ``overrides`` choose one)."""
        cfg = compose([*model_choice(self, overrides), *overrides])  # checked: unknown keys, wrong types
        OmegaConf.update(cfg, KEY, str(self.path))
        return cfg

    def trained_params(self, step: int | None, arch: Mapping[str, Any], target: Any,
                       base: FrozenBase | None = None) -> tuple[Any, int | None]:
        if step is not None:
            raise ConfigError(f"--step {step}: {self.given} is {self.what}, which holds one set of weights "
                              f"(checkpoint steps are a theseus run's)")
        return self.load_params(arch, target.params), None


class HFFolder(ImportedWeights, kind="hf"):
    """A folder holding ``config.json`` and safetensors (what ``save_pretrained`` writes)."""

    what = "a Hugging Face folder"

    def hf_config(self) -> dict[str, Any]:
        return read_config(self.path)

    def where(self) -> str:
        return str(self.path / CONFIG_FILE)

    def tensors(self) -> Checkpoint:
        try:
            return Checkpoint(self.path)
        except ConfigError as exc:
            raise ConfigError(f"{self}: {exc}") from exc

    def tokenizer(self) -> str | None:
        """Its folder's tokenizer.json, if it has one."""
        return str(self.path / JSON_FILE) if (self.path / JSON_FILE).is_file() else None

    def adapter_base_problem(self) -> str | None:
        return None


class GGUFFile(ImportedWeights, kind="gguf"):
    """A ``.gguf`` file: config, tokenizer and tensors in its metadata and data."""

    what = "a GGUF file"

    def hf_config(self) -> dict[str, Any]:
        return gguf.config(self.path)

    def where(self) -> str:
        return str(self.path)

    def tensors(self) -> gguf.Tensors:
        return gguf.Tensors(self.path)

    def tokenizer(self) -> str | None:
        """The file itself: its metadata holds the tokenizer."""
        return str(self.path)

    def adapter_base_problem(self) -> str | None:
        return (f" (peft loads no GGUF file: export it to a folder, python -m theseus.export {self.given} DIR, and "
                f"fine-tune from DIR)")


def _tokenizer_size(tokenizer: str) -> int | None:
    """The vocabulary of a tokenizer known before the corpus is read: byte or a tokenizer.json
    (char and bpe are fitted to the corpus: the trainer checks those against vocab_size)."""
    if tokenizer == "byte":
        return ByteTokenizer.vocab_size
    if tokenizer not in NAMES:
        return HFTokenizer.from_file(tokenizer).vocab_size
    return None
