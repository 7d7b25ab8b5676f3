"""``trainer.init_from=FOLDER``: a composed config resolved against a Hugging Face folder.

    cfg = apply_init_from(cfg)  # before the Trainer: a pure function of the composed config

Every ``architecture.*`` key that config.json determines takes its value; one given explicitly
(an experiment file or the command line: a value other than its field's default) that
contradicts it is a ConfigError naming both, except ``architecture.seq_len``, which may be
lowered (the position table is cut), and ``architecture.dropout``, which config.json does not
set. The vocabulary stays the checkpoint's own ``vocab_size`` (not padded to a multiple of
128): import then export is the identity. The folder's ``tokenizer.json`` becomes
``data.tokenizer`` unless that was given explicitly.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from theseus.config import ConfigError
from theseus.config.registry import every_key, model_class
from theseus.data.tokenizer import JSON_FILE, NAMES, ByteTokenizer, HFTokenizer
from theseus.interop.hf_config import architecture, read_config
from theseus.model.models.gpt import GPT

KEY = "trainer.init_from"


def apply_init_from(cfg: DictConfig) -> DictConfig:
    """``cfg`` with the architecture and tokenizer of ``trainer.init_from`` (unchanged when unset)."""
    given = OmegaConf.select(cfg, KEY)
    if given is None:
        return cfg
    folder = Path(given).expanduser().resolve()
    arch = architecture(read_config(folder), where=str(folder / "config.json"))
    if not issubclass(model_class(cfg), GPT):
        raise ConfigError(f"{KEY} loads a GPT, but model={cfg.get('model')}: leave the model at gpt")
    defaults = every_key()
    cfg = cfg.copy()
    for name, value in arch.items():
        key = f"architecture.{name}"
        current = OmegaConf.select(cfg, key)
        explicit = current != defaults[key].default
        if explicit and name == "seq_len" and current < value:
            continue  # a shorter context than the checkpoint's: allowed
        if explicit and current != value:
            raise ConfigError(f"{key}={current} contradicts {KEY}={given}, whose config.json gives {key}={value}: "
                              f"drop the override (the architecture follows the checkpoint)")
        OmegaConf.update(cfg, key, value, force_add=True)
    tokenizer = OmegaConf.select(cfg, "data.tokenizer")
    if tokenizer == defaults["data.tokenizer"].default and (folder / JSON_FILE).is_file():
        tokenizer = str(folder / JSON_FILE)
        OmegaConf.update(cfg, "data.tokenizer", tokenizer)
    size = _tokenizer_size(tokenizer)
    if size is not None and size > arch["vocab_size"]:
        raise ConfigError(f"data.tokenizer={tokenizer} has {size} tokens, more than the {arch['vocab_size']} rows of "
                          f"{KEY}={given}: use the checkpoint's own tokenizer.json")
    return cfg


def _tokenizer_size(tokenizer: str) -> int | None:
    """The vocabulary of a tokenizer known before the corpus is read: byte or a tokenizer.json
    (char and bpe are fitted to the corpus: the trainer checks those against vocab_size)."""
    if tokenizer == "byte":
        return ByteTokenizer.vocab_size
    if tokenizer not in NAMES:
        return HFTokenizer.from_file(tokenizer).vocab_size
    return None
