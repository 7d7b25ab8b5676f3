"""``trainer.init_from=PATH``: a composed config resolved against the run or model it starts from.

    values = init_from_values(cfg)  # {"architecture.n_layers": 4, ...}: a pure function of the composed config

A theseus run directory (or its ``checkpoints/``, or one step's folder) gives the architecture
it was trained with: every ``architecture.*`` key and ``data.tokenizer`` left at its default
take the run's value (the trainer then restores that checkpoint's weights); any other key is
free to change (learning rate, schedule, steps, data).

A Hugging Face folder:

Every ``architecture.*`` key that config.json determines takes its value; one given explicitly
(an experiment file or the command line: a value other than its field's default) that
contradicts it is a ConfigError naming both, except ``architecture.seq_len``, which may be
lowered (the position table is cut), and ``architecture.dropout``, which config.json does not
set. The vocabulary stays the checkpoint's own ``vocab_size`` (not padded to a multiple of
128): import then export is the identity. The folder's ``tokenizer.json`` becomes
``data.tokenizer`` unless that was given explicitly.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from theseus.config import ConfigError
from theseus.config.compose import chosen_files
from theseus.config.registry import chosen, chosen_schema, load, model_class, names, read_saved
from theseus.config.schema import flatten
from theseus.data.tokenizer import JSON_FILE, NAMES, ByteTokenizer, HFTokenizer
from theseus.interop.hf_config import architecture, format_of, read_config
from theseus.interop.hf_weights import Checkpoint
from theseus.model.models.gpt import GPT
from theseus.model.models.moe_gpt import MoEGPT
from theseus.training.checkpoint import require_checkpoint, run_of, saved_base, theseus_checkpoint

KEY = "trainer.init_from"


def model_choice(folder: Path, overrides: Sequence[str]) -> list[str]:
    """``["model=NAME"]``, the model ``folder`` loads into, when neither ``overrides`` nor an
    experiment file they choose picks a model: a theseus run's own (its recorded choice: a
    user's ``scaled_gpt``), a Hugging Face folder's (``moe`` for Mixtral and Qwen2-MoE); else
    ``[]`` (a model given explicitly stays, for ``init_from_values`` and the shapes to check)."""
    if chooses_model(overrides):
        return []
    checkpoint = theseus_checkpoint(Path(folder))
    if checkpoint is not None:
        return _run_model(checkpoint)
    if not (Path(folder).expanduser() / "config.json").is_file():
        return []
    try:
        return [f"model={format_of(read_config(Path(folder).expanduser().resolve())).model}"]
    except ConfigError:  # a broken config.json: init_from_values reports it
        return []


def _run_model(checkpoint: Path) -> list[str]:
    """``["model=NAME"]``: the model the theseus run of ``checkpoint`` was trained with (``[]``
    for the primary config's own, or a checkpoint without its run's config); ConfigError when
    no module imported here registers it."""
    run = run_of(checkpoint.expanduser())
    if run is None:
        return []
    load()  # the user's modules: their models are options
    name = chosen(read_saved(run / ".hydra" / "config.yaml"), "model")
    if name == chosen({}, "model"):
        return []
    if name not in names("model"):
        raise ConfigError(f"{KEY}={checkpoint} is a run of model={name}, which no module imported here registers: "
                          f"run from the folder whose pyproject.toml declares it ([tool.theseus] imports), or "
                          f"set model=NAME")
    return [f"model={name}"]


def command_line_choice(overrides: Sequence[str]) -> list[str]:
    """``model_choice`` of the folder or run that ``trainer.init_from=PATH`` in ``overrides`` names."""
    given = [o.partition("=")[2] for o in overrides if o.lstrip("+").partition("=")[0] == KEY]
    return model_choice(Path(given[-1]), overrides) if given and given[-1] else []


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


def hf_folder(init_from: str | None) -> Path | None:
    """The Hugging Face folder ``trainer.init_from`` names (None: unset, or a theseus checkpoint)."""
    if init_from is None or theseus_checkpoint(Path(init_from)) is not None:
        return None
    return Path(init_from).expanduser()


def init_from_values(cfg: DictConfig) -> dict[str, Any]:
    """What ``trainer.init_from`` determines, as dotted keys and values (``{}`` when unset):
    the architecture and tokenizer of the run or Hugging Face folder it names; ConfigError for
    a folder theseus cannot load, or an explicit key that contradicts it."""
    flat = flatten(OmegaConf.to_container(cfg, resolve=True))
    given = flat.get(KEY)
    if given is None:
        return {}
    folder = Path(given).expanduser().resolve()
    require_checkpoint(folder)  # a run directory that saved none: said as such, not as a broken folder
    run = theseus_checkpoint(folder)
    if run is not None:
        return _from_run(cfg, flat, run)
    hf = read_config(folder)
    arch = architecture(hf, where=str(folder / "config.json"))
    try:
        Checkpoint(folder)  # its weights are there (safetensors, not pickle), before anything is written
    except ConfigError as exc:
        raise ConfigError(f"{KEY}={given}: {exc}") from exc
    model = format_of(hf).model
    cls = model_class(cfg)
    if not issubclass(cls, GPT) or issubclass(cls, MoEGPT) != (model == "moe"):
        raise ConfigError(f"{KEY}={given} is a Hugging Face {hf['model_type']} checkpoint, which loads into "
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
            raise ConfigError(f"{key}={current} contradicts {KEY}={given}, whose config.json gives {key}={value}: "
                              f"drop the override (the architecture follows the checkpoint)")
        values[key] = value
    tokenizer = flat["data.tokenizer"]
    if tokenizer == defaults["data.tokenizer"].default and (folder / JSON_FILE).is_file():
        tokenizer = values["data.tokenizer"] = str(folder / JSON_FILE)
    size = _tokenizer_size(tokenizer)
    if size is not None and size > arch["vocab_size"]:
        raise ConfigError(f"data.tokenizer={tokenizer} has {size} tokens, more than the {arch['vocab_size']} rows of "
                          f"{KEY}={given}: use the checkpoint's own tokenizer.json")
    return values


def _from_run(cfg: DictConfig, flat: dict[str, Any], checkpoint: Path) -> dict[str, Any]:
    """The architecture and tokenizer of the theseus run ``checkpoint`` belongs to, wherever
    ``cfg`` leaves them at their defaults."""
    run = run_of(checkpoint)
    if run is None:
        raise ConfigError(f"{KEY}={checkpoint} has no .hydra/config.yaml beside its checkpoints: give the run "
                          f"directory a theseus run wrote")
    if saved_base(checkpoint) is not None:
        raise ConfigError(f"{KEY}={checkpoint} holds LoRA adapters without their base: export it merged "
                          f"(python -m theseus.export {checkpoint} OUT) and start from OUT")
    record = read_saved(run / ".hydra" / "config.yaml")
    saved = flatten(OmegaConf.to_container(record, resolve=True))
    defaults = chosen_schema(cfg)
    model = chosen(record, "model")
    lacking = [key for key in saved if key.startswith("architecture.") and key not in defaults]
    if lacking and model != chosen(cfg, "model"):  # model_choice chose it for a command line; not so a config
        raise ConfigError(f"{KEY}={checkpoint} is a run of model={model} ({lacking[0]}={saved[lacking[0]]}), which "
                          f"model={chosen(cfg, 'model')} cannot build: add model={model}")
    return {key: saved[key] for key in defaults
            if (key.startswith("architecture.") or key == "data.tokenizer")
            and saved.get(key) is not None and flat.get(key) == defaults[key].default}


def _tokenizer_size(tokenizer: str) -> int | None:
    """The vocabulary of a tokenizer known before the corpus is read: byte or a tokenizer.json
    (char and bpe are fitted to the corpus: the trainer checks those against vocab_size)."""
    if tokenizer == "byte":
        return ByteTokenizer.vocab_size
    if tokenizer not in NAMES:
        return HFTokenizer.from_file(tokenizer).vocab_size
    return None
