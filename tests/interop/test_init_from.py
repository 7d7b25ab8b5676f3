"""``init_from_values``: the composed config resolved against a Hugging Face folder, and the
folder's mistakes refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from flax import traverse_util
from interop.hf_models import target_of, theseus_model
from omegaconf import OmegaConf

from theseus.config import ConfigError
from theseus.config.compose import compose, with_values
from theseus.data.tokenizer import HFTokenizer
from theseus.interop.hf_config import arch_of
from theseus.model import lora
from theseus.recipe import assemble, resolve
from theseus.sources.in_config import init_from_values, init_source
from theseus.sources.weights import load_params


def resolved(folder: Path, *overrides: str):
    cfg = compose([f"trainer.init_from={folder}", *overrides])
    return with_values(cfg, init_from_values(cfg, init_source(cfg)))


def edited(folder: Path, tmp: Path, **changes) -> Path:
    """A copy of ``folder`` whose config.json has ``changes`` (None: the entry removed)."""
    copy = tmp / "edited"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config.update(changes)
    (copy / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return copy


def test_the_architecture_and_tokenizer_follow_the_folder(llama_folder):
    cfg = resolved(llama_folder, "architecture.seq_len=16", "architecture.dropout=0.1")
    arch = OmegaConf.to_container(cfg.architecture)
    assert {k: arch[k] for k in ("vocab_size", "n_layers", "d_model", "n_heads", "n_kv_heads", "d_ff")} == \
        {"vocab_size": 333, "n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "d_ff": 96}
    assert (arch["norm"], arch["activation"], arch["positions"], arch["bias"], arch["tie_embeddings"]) == \
        ("rmsnorm", "swiglu", "rope", False, False)
    assert arch["rope_theta"] == 500000.0 and arch["seq_len"] == 16 and arch["dropout"] == 0.1  # lowered, set
    assert cfg.data.tokenizer == str(llama_folder / "tokenizer.json")
    assert resolved(llama_folder).architecture.seq_len == 64


def test_an_explicit_tokenizer_is_kept(llama_folder):
    assert resolved(llama_folder, "data.tokenizer=char").data.tokenizer == "char"


def test_a_config_without_init_from_is_unchanged():
    cfg = compose(["architecture.n_layers=3"])
    assert init_from_values(cfg, init_source(cfg)) == {}


def test_a_tokenizer_larger_than_the_vocabulary_is_one_line(gpt2_folder, tmp_path):
    folder = edited(gpt2_folder, tmp_path, vocab_size=200)
    (folder / "tokenizer.json").unlink()  # so the run's tokenizer is data.tokenizer's default, byte (257)
    with pytest.raises(ConfigError, match=r"^data.tokenizer=byte has 257 tokens, more than the 200 rows of "
                                          r"trainer.init_from=.*: use the checkpoint's own tokenizer$"):
        resolved(folder)


@pytest.mark.parametrize(("changes", "message"), [
    ({"model_type": "qwen3_moe"}, "model_type 'qwen3_moe' is not supported; theseus imports gpt2, llama, qwen2, qwen3"),
    ({"attention_bias": True}, "attention_bias=True is not supported for model_type llama"),
    ({"model_type": "qwen2", "use_sliding_window": True},
     "use_sliding_window=True is not supported for model_type qwen2"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0}}, "RoPE scaling 'yarn' is not supported"),
    # heads that do not divide, in config.json's names (before: theseus's, or numpy's reshape error)
    ({"num_attention_heads": 5, "num_key_value_heads": 5, "head_dim": None},
     "num_attention_heads=5 does not divide hidden_size=64: fix config.json (or give the heads' width, head_dim)"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3 does not divide num_attention_heads=4 (each key/value head "
                                 "serves a whole group of query heads): fix config.json"),
    ({"num_attention_heads": 0}, "num_attention_heads=0 must be a positive integer"),
])
def test_what_theseus_does_not_compute_is_refused(llama_folder, tmp_path, changes, message):
    with pytest.raises(ConfigError, match=f"config.json: {message}".replace("(", r"\(").replace(")", r"\)")):
        resolved(edited(llama_folder, tmp_path, **changes))


def test_pickle_checkpoints_are_refused_with_the_conversion(gpt2_folder, tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    shutil.copy(gpt2_folder / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"not opened")
    model = theseus_model(folder)
    with pytest.raises(ConfigError, match=r"holds pytorch_model.bin \(pickle\), which theseus does not load: "
                                          r"convert it with transformers: .*save_pretrained\(folder, "
                                          r"safe_serialization=True\)"):
        load_params(folder, arch_of(model), target_of(model))


def test_weights_the_config_does_not_describe_are_refused(gpt2_folder, llama_folder, tmp_path):
    folder = edited(gpt2_folder, tmp_path, n_layer=1)
    model = theseus_model(folder)
    with pytest.raises(ConfigError, match=r"tensor transformer.h.1.attn.c_attn.bias \(and 11 more\) of the "
                                          r"checkpoint has no place in the model"):
        load_params(folder, arch_of(model), target_of(model))
    shutil.rmtree(folder)
    folder = edited(llama_folder, tmp_path, num_attention_heads=8, num_key_value_heads=4, head_dim=16)  # wider q, k, v
    model = theseus_model(folder)
    with pytest.raises(ConfigError) as err:
        load_params(folder, arch_of(model), target_of(model))
    assert str(err.value) == (f"{folder}: the checkpoint's tensors of parameter h_0/attn/wk do not have the shapes its "
                              f"config gives (cannot reshape array of size 2048 into shape (64,4,16)): fix "
                              f"{folder}/config.json, or give the weights it describes")


def test_a_missing_folder_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.init_from=.*nowhere does not exist: give a Hugging Face folder"):
        resolved(tmp_path / "nowhere")


def test_a_config_that_cannot_build_the_runs_model_is_refused_naming_it(tmp_path):
    """From Python, a config of another model (the plain GPT) than the run's (MoE, whose keys it
    lacks) would silently build that other model: one line saying which model= to add."""
    (tmp_path / ".hydra").mkdir()
    OmegaConf.save(compose(["+experiment=moe_small"]), tmp_path / ".hydra" / "config.yaml")
    (tmp_path / "checkpoints" / "5" / "state").mkdir(parents=True)
    with pytest.raises(ConfigError, match=rf"^trainer.init_from={tmp_path} is a run of model=moe \(architecture\.moe\."
                                          r"\w+=\S+\), which model=gpt cannot build: add model=moe$"):
        resolved(tmp_path, "+experiment=gpt_tiny")
    assert resolved(tmp_path, "model=moe").architecture.n_layers == 6


@pytest.mark.parametrize("seed", [0, 3])
def test_loras_fresh_adapters_on_a_folders_weights_are_drawn_from_the_runs_seed(llama_folder, seed):
    """trainer.seed draws a LoRA run's adapters as it draws a fresh model's params: a folder
    holds none, so they start as ``lora.initial`` makes them from that seed (B zero)."""
    cfg = compose([f"trainer.init_from={llama_folder}", "architecture.lora.rank=4", f"trainer.seed={seed}"])
    run = assemble(resolve(cfg), steps=None, tokenizer=HFTokenizer.from_file(llama_folder / "tokenizer.json"))
    params = traverse_util.flatten_dict(run.start(run.compiled, lambda line: None)[0].params, sep="/")
    adapters = {path: np.asarray(leaf) for path, leaf in params.items() if lora.is_adapter(path)}
    assert any(value.any() for value in adapters.values())
    for path, value in adapters.items():
        np.testing.assert_array_equal(value, lora.initial(path, value.shape, value.dtype, seed), err_msg=path)


def test_a_run_from_a_folder_passes_the_folders_architecture_and_tokenizer_on(llama_folder, tmp_path):
    """trainer.init_from a theseus run that started from a Hugging Face folder: its saved config
    names the folder, not the architecture and tokenizer the folder gave it, and a run from it
    (the ``continue:`` command a run prints) takes them from the folder as that run did."""
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose([f"trainer.init_from={llama_folder}", "architecture.seq_len=16"]),
                   run / ".hydra" / "config.yaml")
    (run / "checkpoints" / "1").mkdir(parents=True)
    ours, folders = resolved(run), resolved(llama_folder, "architecture.seq_len=16")
    assert OmegaConf.to_container(ours.architecture) == OmegaConf.to_container(folders.architecture)
    assert ours.data.tokenizer == str(llama_folder / "tokenizer.json")


def test_a_data_position_is_taken_from_a_run_of_the_same_data_only(tmp_path):
    """trainer.init_data reads on where the run stopped in its data: with other data.* (those a
    resume may not change) the position means nothing there (accepted silently before)."""
    from theseus.training.resume import check_asked
    from theseus.training.settings import configure_settings

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose(["+experiment=gpt_tiny", "data.source=text", "data.path=a.txt"]),
                   run / ".hydra" / "config.yaml")
    (run / "checkpoints" / "5").mkdir(parents=True)

    def check(*overrides: str) -> None:
        cfg = resolved(run, "+experiment=gpt_tiny", "data.source=text", "trainer.init_data=true", *overrides)
        check_asked(configure_settings(cfg).trainer, init_source(cfg), cfg)

    check("data.path=a.txt", "data.cache_dir=elsewhere", "optimizer.lr=1e-4")  # the same data, cached elsewhere
    with pytest.raises(ConfigError) as err:
        check("data.path=b.txt", "data.seed=3")
    assert str(err.value) == (f"trainer.init_data=true reads on where trainer.init_from={run} stopped in its data, but "
                              f"this run's data differs (data.path: 'a.txt' -> 'b.txt', data.seed: 0 -> 3): a position "
                              f"in other data means nothing; give the run's data.* or drop trainer.init_data")
