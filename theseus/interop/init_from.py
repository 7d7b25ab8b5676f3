"""``trainer.init_from=SOURCE``: a composed config resolved against the model it starts from.

    source = init_source(cfg)                 # the ModelSource trainer.init_from names, or None
    values = init_from_values(cfg, source)    # {"architecture.n_layers": 4, ...}: a pure function of both

A theseus run (its directory, ``checkpoints/``, or one step's folder) gives the architecture
it was trained with: every ``architecture.*`` key and ``data.tokenizer`` left at its default
take the run's value (the trainer then restores that checkpoint's weights); any other key is
free to change (learning rate, schedule, steps, data).

A Hugging Face folder or a GGUF file (whose metadata is read as the config.json it stands for):
every ``architecture.*`` key that the config determines takes its value; one given explicitly
(an experiment file or the command line: a value other than its field's default) that
contradicts it is a ConfigError naming both, except ``architecture.seq_len``, which may be
lowered (the position table is cut), and ``architecture.dropout``, which the config does not
set. The vocabulary stays the checkpoint's own ``vocab_size`` (not padded to a multiple of
128): import then export is the identity. Its tokenizer (the folder's ``tokenizer.json``, the
GGUF file's own) becomes ``data.tokenizer`` unless that was given explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from theseus.config import ConfigError
from theseus.config.compose import chosen_files, with_values
from theseus.config.registry import chosen, chosen_schema, load, model_class, names, read_saved
from theseus.config.schema import flatten
from theseus.data.tokenizer import NAMES, ByteTokenizer, HFTokenizer
from theseus.interop.hf_config import architecture, format_of
from theseus.interop.sources import hf_config_of, tensors_of, tokenizer_of, where
from theseus.model.models.gpt import GPT
from theseus.model.models.moe_gpt import MoEGPT
from theseus.model.source import ModelSource, parse_source
from theseus.training.checkpoint import saved_base

KEY = "trainer.init_from"


def model_choice(source: ModelSource, overrides: Sequence[str]) -> list[str]:
    """``["model=NAME"]``, the model ``source`` loads into, when neither ``overrides`` nor an
    experiment file they choose picks a model: a theseus run's own (its recorded choice: a
    user's ``scaled_gpt``), a Hugging Face model's (``moe`` for Mixtral and Qwen2-MoE); else
    ``[]`` (a model given explicitly stays, for ``init_from_values`` and the shapes to check)."""
    if chooses_model(overrides):
        return []
    if source.kind == "run":
        return _run_model(source)
    try:
        return [f"model={format_of(hf_config_of(source)).model}"]
    except ConfigError:  # a broken config: init_from_values reports it
        return []


def _run_model(source: ModelSource) -> list[str]:
    """``["model=NAME"]``: the model the theseus run of ``source`` was trained with (``[]``
    for the primary config's own, or a checkpoint without its run's config); ConfigError when
    no module imported here registers it."""
    run = source.run_dir
    if run is None:
        return []
    load()  # the user's modules: their models are options
    name = chosen(read_saved(run / ".hydra" / "config.yaml"), "model")
    if name == chosen({}, "model"):
        return []
    if name not in names("model"):
        raise ConfigError(f"{source} is a run of model={name}, which no module imported here registers: "
                          f"run from the folder whose pyproject.toml declares it ([tool.theseus] imports), or "
                          f"set model=NAME")
    return [f"model={name}"]


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
    if source is None:
        return {}
    flat = flatten(OmegaConf.to_container(cfg, resolve=True))
    if source.kind == "run":
        return _from_run(cfg, flat, source)
    hf = hf_config_of(source)
    arch = architecture(hf, where=where(source))
    tensors_of(source)  # its weights are there (safetensors, not pickle), before anything is written
    model = format_of(hf).model
    cls = model_class(cfg)
    if not issubclass(cls, GPT) or issubclass(cls, MoEGPT) != (model == "moe"):
        raise ConfigError(f"{source} is a Hugging Face {hf['model_type']} model, which loads into "
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
            raise ConfigError(f"{key}={current} contradicts {source}, whose config gives {key}={value}: "
                              f"drop the override (the architecture follows the checkpoint)")
        values[key] = value
    tokenizer = flat["data.tokenizer"]
    if tokenizer == defaults["data.tokenizer"].default and tokenizer_of(source) is not None:
        tokenizer = values["data.tokenizer"] = tokenizer_of(source)
    size = _tokenizer_size(tokenizer)
    if size is not None and size > arch["vocab_size"]:
        raise ConfigError(f"data.tokenizer={tokenizer} has {size} tokens, more than the {arch['vocab_size']} rows of "
                          f"{source}: use the checkpoint's own tokenizer")
    return values


def _from_run(cfg: DictConfig, flat: dict[str, Any], source: ModelSource) -> dict[str, Any]:
    """The architecture and tokenizer of the theseus run ``source`` names, wherever ``cfg``
    leaves them at their defaults: its saved config's, with what its own ``trainer.init_from``
    determined (a run from a Hugging Face folder has the folder's)."""
    if saved_base(source.path) is not None:
        raise ConfigError(f"{source} holds LoRA adapters without their base: export it merged "
                          f"(python -m theseus.export {source.given} OUT) and start from OUT")
    record = _run_record(source)
    saved = flatten(OmegaConf.to_container(record, resolve=True))
    defaults = chosen_schema(cfg)
    model = chosen(record, "model")
    lacking = [key for key in saved if key.startswith("architecture.") and key not in defaults]
    if lacking and model != chosen(cfg, "model"):  # model_choice chose it for a command line; not so a config
        raise ConfigError(f"{source} is a run of model={model} ({lacking[0]}={saved[lacking[0]]}), which "
                          f"model={chosen(cfg, 'model')} cannot build: add model={model}")
    return {key: saved[key] for key in defaults
            if (key.startswith("architecture.") or key == "data.tokenizer")
            and saved.get(key) is not None and flat.get(key) == defaults[key].default}


# architecture keys a model that computes what another does may set otherwise: its context, its
# vocabulary (the weights' shapes say), how it was initialised, trained, adapted and run
FREE = tuple(f"architecture.{key}" for key in ("seq_len", "vocab_size", "dropout", "init_std", "remat", "scan_layers",
                                               "attention_impl", "dtype.", "lora.", "moe.aux_loss", "moe.z_loss",
                                               "moe.bias_update_rate"))


def source_architecture(source: ModelSource) -> tuple[str, dict[str, Any]]:
    """``(model, values)``: the model (``model=NAME``) ``source`` loads into and the
    ``architecture.*`` values it computes with, the widths a GPT derives written out: a Hugging
    Face folder's or GGUF file's config, a theseus run's saved config (with what its own
    ``trainer.init_from`` determined)."""
    if source.kind != "run":
        hf = hf_config_of(source)
        return format_of(hf, where(source)).model, _widths({f"architecture.{key}": value for key, value in
                                                           architecture(hf, where(source)).items()})
    record = _run_record(source)
    saved = flatten(OmegaConf.to_container(record, resolve=True))
    return chosen(record, "model"), _widths({key: value for key, value in saved.items()
                                             if key.startswith("architecture.")})


def _run_record(source: ModelSource) -> DictConfig:
    """The saved config of the theseus run ``source`` names, with what its own ``trainer.init_from``
    determined laid over it (a run from a Hugging Face folder: the folder's architecture)."""
    run = source.run_dir
    if run is None:
        raise ConfigError(f"{source} has no .hydra/config.yaml beside its checkpoints: give the run "
                          f"directory a theseus run wrote")
    record = read_saved(run / ".hydra" / "config.yaml")
    return with_values(record, init_from_values(record, init_source(record)))


def check_same_architecture(cfg: DictConfig, source: ModelSource) -> None:
    """ConfigError unless the model ``source`` names (a task's reference: ``dpo.reference``)
    computes what the run's model (``cfg``'s, ``trainer.init_from``'s values laid over it) does,
    its weights aside: the same model and every architecture key they both set alike (``FREE``
    apart). Its weights are read onto the run's model: another architecture's would not fit, or
    would be computed as the run's."""
    model, theirs = source_architecture(source)
    ours = _widths({key: value for key, value in flatten(OmegaConf.to_container(cfg, resolve=True)).items()
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


def _widths(values: dict[str, Any]) -> dict[str, Any]:
    """``architecture.*`` ``values`` with the widths a GPT derives where unset written out: d_ff
    (4 x d_model), n_kv_heads (n_heads), head_dim (d_model / n_heads)."""
    out, key = dict(values), "architecture.{}".format
    d, heads = out.get(key("d_model")), out.get(key("n_heads"))
    if isinstance(d, int) and isinstance(heads, int) and heads:
        for name, derived in (("d_ff", 4 * d), ("n_kv_heads", heads), ("head_dim", d // heads)):
            out[key(name)] = out.get(key(name)) or derived
    return out


def _tokenizer_size(tokenizer: str) -> int | None:
    """The vocabulary of a tokenizer known before the corpus is read: byte or a tokenizer.json
    (char and bpe are fitted to the corpus: the trainer checks those against vocab_size)."""
    if tokenizer == "byte":
        return ByteTokenizer.vocab_size
    if tokenizer not in NAMES:
        return HFTokenizer.from_file(tokenizer).vocab_size
    return None
