"""A model source as a composed config names it: ``trainer.init_from``, and what it determines there.

    source = init_source(cfg)                 # the ModelSource trainer.init_from names, or None
    values = init_from_values(cfg, source)    # {"architecture.n_layers": 4, ...}: a pure function of both

Each kind says what it determines (``ModelSource.init_from_values``): a theseus run its
architecture and tokenizer wherever the config leaves them at their defaults, a Hugging Face
folder or GGUF file every ``architecture.*`` key its config.json gives. A command line that
names a source without choosing a model gets the one it loads into (``command_line_choice``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from theseus.config import ConfigError
from theseus.config.compose import chosen_files
from theseus.config.registry import chosen
from theseus.config.schema import flatten
from theseus.sources.model_source import ModelSource, widths
from theseus.sources.parse import parse_source

KEY = "trainer.init_from"


def model_choice(source: ModelSource, overrides: Sequence[str]) -> list[str]:
    """``["model=NAME"]``, the model ``source`` loads into, when neither ``overrides`` nor an
    experiment file they choose picks a model: a theseus run's own (its recorded choice: a
    user's ``scaled_gpt``), a Hugging Face model's (``moe`` for Mixtral and Qwen2-MoE); else
    ``[]`` (a model given explicitly stays, for ``init_from_values`` and the shapes to check)."""
    return [] if chooses_model(overrides) else source.model_choice()


def command_line_choice(overrides: Sequence[str]) -> list[str]:
    """``model_choice`` of the model that ``trainer.init_from=SOURCE`` in ``overrides`` names
    (``[]`` when it names none: the run's checks say why, a resumed run's missing base first)."""
    given = [o.partition("=")[2] for o in overrides if o.lstrip("+").partition("=")[0] == KEY]
    try:
        source = parse_source(given[-1], KEY) if given and given[-1] else None
    except ConfigError:
        return []
    return model_choice(source, overrides) if source else []


def chooses_model(overrides: Sequence[str]) -> bool:
    """``model=NAME`` in ``overrides``, or ``override /model: NAME`` in an experiment file they choose."""
    if any(o.lstrip("+~").partition("=")[0] == "model" for o in overrides):
        return True
    for path in chosen_files(overrides):
        try:
            defaults = OmegaConf.load(path).get("defaults") or []
        except Exception:  # a file that does not parse: composing it reports that
            continue
        for entry in defaults:
            if OmegaConf.is_dict(entry) and any(str(k).split()[-1].strip("/") == "model" for k in entry):
                return True
    return False


def init_source(cfg: DictConfig) -> ModelSource | None:
    """The model ``trainer.init_from`` names in a composed config (None: unset)."""
    given = flatten(OmegaConf.to_container(cfg, resolve=True)).get(KEY)
    return None if given is None else parse_source(given, KEY)


def init_from_values(cfg: DictConfig, source: ModelSource | None) -> dict[str, Any]:
    """What ``source`` (``trainer.init_from``) determines, as dotted keys and values (``{}``
    when None): the architecture and tokenizer of the run or model it names; ConfigError for a
    model theseus cannot load, or an explicit key that contradicts it."""
    return {} if source is None else source.init_from_values(cfg)


# architecture keys a model that computes what another does may set otherwise: its context, its
# vocabulary (the weights' shapes say), how it was initialised, trained, adapted and run
FREE = tuple(f"architecture.{key}" for key in ("seq_len", "vocab_size", "dropout", "init_std", "remat", "scan_layers",
                                               "attention_impl", "splash_fused_backward", "dtype.", "lora.",
                                               "moe.aux_loss", "moe.z_loss", "moe.bias_update_rate"))


def check_same_architecture(cfg: DictConfig, source: ModelSource) -> None:
    """ConfigError unless the model ``source`` names (a task's reference: ``dpo.reference``)
    computes what the run's model (``cfg``'s, ``trainer.init_from``'s values laid over it) does,
    its weights aside: the same model and every architecture key they both set alike (``FREE``
    apart). Its weights are read onto the run's model: another architecture's would not fit, or
    would be computed as the run's."""
    model, theirs = source.architecture()
    ours = widths({key: value for key, value in flatten(OmegaConf.to_container(cfg, resolve=True)).items()
                   if key.startswith("architecture.")})
    differs = [] if model == chosen(cfg, "model") else [("model", model, chosen(cfg, "model"))]
    differs += [(key, value, ours[key]) for key, value in sorted(theirs.items())
                if key in ours and not key.startswith(FREE) and value != ours[key]]
    if differs:
        shown = "; ".join(f"{key}: {there} there, {here} here" for key, there, here in differs[:3])
        more = f"; {len(differs) - 3} more" if len(differs) > 3 else ""
        raise ConfigError(f"{source}: its architecture differs from the policy's ({shown}{more}): give a reference "
                          f"of the policy's architecture and vocabulary (the model it starts from, or a checkpoint of "
                          f"its run), or {source.key}=none")
