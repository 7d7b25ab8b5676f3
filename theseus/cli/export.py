"""``python -m theseus.export SOURCE OUT_DIR [--step N]``: a run's checkpoint as a Hugging Face folder.

SOURCE is a model source: a theseus run (its newest checkpoint, the step its path names, or
``--step``), or a GGUF file, a Hugging Face folder or a model id in the local Hugging Face
cache, whose weights are written as a plain Hugging Face folder (a GGUF file's dequantised).

Writes ``config.json``, ``model.safetensors``, ``tokenizer.json`` and ``tokenizer_config.json``
(byte and char tokenizers too; the chat template in it: an SFT run's, or its tokenizer's own);
``transformers.AutoModelForCausalLM.from_pretrained(OUT_DIR)`` and
``AutoTokenizer.from_pretrained(OUT_DIR)`` load it. GPT-2-style runs export as ``gpt2``,
Llama-style ones as ``llama``, a run from a Hugging Face folder as that folder's model_type, its
config.json's other fields (its ``max_position_embeddings`` with RoPE, rope scaling, token ids)
kept. Only what the format expresses exactly is written
(``theseus.interop.expressible``): a config key without an equivalent, a parameter without a
place or a model class computing something else is refused in one line, and nothing is
written. The vocabulary keeps a ``trainer.init_from`` checkpoint's own size (import then export
is the identity); a run that padded its tokenizer's vocabulary to a multiple of 128 drops the
padding rows.

A LoRA run (``architecture.lora.rank`` > 0) exports merged: each adapted weight is
``W + alpha / rank x A B``, a plain model of its model_type. With ``--adapter`` it writes peft's
``adapter_config.json`` and ``adapter_model.safetensors`` instead, against the Hugging Face folder
the run started from (``trainer.init_from``): ``peft.PeftModel.from_pretrained(base, OUT_DIR)``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import traverse_util

from theseus.cli.trained import load_trained
from theseus.config import ConfigError
from theseus.config.arguments import NON_NEGATIVE_INT, Parser
from theseus.data.tokenizer import export_tokenizer
from theseus.interop.expressible import check_expressible
from theseus.interop.hf_config import CONFIG_FILE, arch_of, hf_config
from theseus.interop.hf_weights import save, to_hf
from theseus.interop.peft_adapter import adapter_config, adapter_tensors, save_adapter
from theseus.model.lora import LoRA, merged, settings_of, without_adapters
from theseus.model.models.gpt import unstack_layers
from theseus.sources.checkpoint_folders import SAVED_CONFIG
from theseus.sources.imported import ImportedWeights
from theseus.sources.model_source import ModelSource
from theseus.sources.parse import parse_source
from theseus.tasks.task import chat_template_of


def check_destination(source: ModelSource, out_dir: Path) -> None:
    """ConfigError unless ``out_dir`` is a new or empty folder outside ``source``'s run or folder:
    an export overwrites no other model's files and writes nothing into a run (arguments given swapped)."""
    home = source.run_dir or source.path
    if (out_dir / SAVED_CONFIG).is_file():
        raise ConfigError(f"{out_dir} is a run directory, not a folder to export into: the arguments are SOURCE "
                          f"OUT_DIR (python -m theseus.export {out_dir} {out_dir}-hf)")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"{out_dir} exists and is not an empty folder: export into a new folder (or remove it)")
    above = next((parent for parent in out_dir.absolute().parents if parent.exists()), None)
    if above is not None and not above.is_dir():
        raise ConfigError(f"{out_dir}: {above} is a file, not a folder to export into: give a path whose folders "
                          f"are folders")
    if home.is_dir() and out_dir.resolve().is_relative_to(home):
        raise ConfigError(f"{out_dir} is inside {source.given}: export into a folder outside it "
                          f"(python -m theseus.export {source.given} {home}-hf)")


def export(source: ModelSource, out_dir: Path, step: int | None = None, adapter: bool = False) -> None:
    """Write the Hugging Face folder ``out_dir`` of ``source``'s weights (a run's newest checkpoint,
    or ``step``); ``adapter``: its LoRA adapters in peft's format instead."""
    out_dir = out_dir.expanduser()
    check_destination(source, out_dir)
    run = load_trained(source, step)
    model, params, tokenizer, lora = run.model, run.params, run.tokenizer, settings_of(run.model)
    imported = run.base
    if adapter:
        export_adapter(model, params, lora, imported, out_dir)
        return
    if lora.rank:  # the adapters merged into their weights: a plain model
        model, params = without_adapters(model), merged(jax.device_get(params), lora.scale)
    base = imported.hf_config() if imported else None  # its config.json's fields kept, where unchanged
    kind = check_expressible(model, params, (base or {}).get("model_type"))  # refused before writing
    params = unstack_layers(params) if model.scan_layers else params  # Hugging Face's layers are one by one
    arch = arch_of(model)
    vocab_size = model.vocab_size if imported else tokenizer.vocab_size
    special = base or {"bos_token_id": tokenizer.eot, "eos_token_id": tokenizer.eot}
    flat = {path: np.asarray(value)
            for path, value in traverse_util.flatten_dict(jax.device_get(params), sep="/").items()}
    tensors = to_hf(kind, arch, flat, vocab_size)
    config = hf_config(arch, vocab_size, special, dtype=str(flat["wte/embedding"].dtype), base=base)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save(tensors, out_dir)
    template = chat_template_of(run.cfg)  # the task's (sft, dpo), or its tokenizer's own: apply_chat_template renders it
    export_tokenizer(tokenizer, out_dir, template.settings() if template else None)


def export_adapter(model: Any, params: Any, lora: LoRA, base: ImportedWeights | None, out_dir: Path) -> None:
    """Write the adapters of ``params`` (a LoRA run's) in peft's format against the Hugging Face
    folder ``base`` (the run's ``trainer.init_from``); ConfigError, nothing written, without them."""
    if not lora.rank:
        raise ConfigError("--adapter: the run has no LoRA adapters (architecture.lora.rank=0): export it without "
                          "--adapter")
    hint = "" if base is None else base.adapter_base_problem()
    if hint is not None:
        raise ConfigError(f"--adapter writes adapters against the Hugging Face folder the run started from "
                          f"(trainer.init_from), but it started from {base.given if base else 'no weights'}: "
                          f"export it merged, without --adapter{hint}")
    kind = check_expressible(without_adapters(model), merged(jax.device_get(params), lora.scale),
                             base.hf_config().get("model_type"))
    unrolled = unstack_layers(params) if model.scan_layers else params
    tensors = adapter_tensors(kind, jax.device_get(unrolled))
    save_adapter(out_dir, tensors, adapter_config(kind, lora, tensors, str(base.path)))


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m theseus.export", description=__doc__.splitlines()[0])
    parser.add_argument("source", help="a theseus run or checkpoint (or a .gguf file, a Hugging Face folder, a model "
                                       "id in the local Hugging Face cache: written as a plain folder)")
    parser.add_argument("out_dir", type=Path, help="the Hugging Face folder to write (new or empty)")
    parser.add_argument("--step", type=NON_NEGATIVE_INT, default=None, help="checkpoint step (default: the newest)")
    parser.add_argument("--adapter", action="store_true",
                        help="a LoRA run's adapters in peft's format (adapter_config.json, adapter_model.safetensors) "
                             "instead of the merged model")
    args = parser.parse_args(argv)
    try:
        export(parse_source(args.source, key=None), args.out_dir, args.step, args.adapter)
    except ConfigError as exc:
        print(f"theseus: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out_dir}", file=sys.stderr)
    return 0
