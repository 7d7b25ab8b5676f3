"""Fixtures: tiny Hugging Face folders (GPT-2, Llama, Qwen2, Mixtral, Qwen2-MoE and the families of
hf_models.FAMILIES: Llama 3.x, Qwen3, Mistral, Phi-3, Gemma 2 and 3), saved once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from interop.hf_models import (
    FAMILIES,
    gpt2_config,
    llama_config,
    mixtral_config,
    qwen2_config,
    qwen2_moe_config,
    save_hf,
    transformers,
)


@pytest.fixture
def umask_022():
    """The common umask 022 while a test runs (its subprocesses inherit it): files ``-rw-r--r--``."""
    saved = os.umask(0o022)
    yield
    os.umask(saved)


@pytest.fixture(scope="session")
def gpt2_folder(tmp_path_factory) -> Path:
    return save_hf(transformers.GPT2LMHeadModel(gpt2_config()), tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="session")
def llama_folder(tmp_path_factory) -> Path:
    return save_hf(transformers.LlamaForCausalLM(llama_config()), tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="session")
def llama_sharded_folder(tmp_path_factory) -> Path:
    return save_hf(transformers.LlamaForCausalLM(llama_config()), tmp_path_factory.mktemp("llama_sharded"),
                   tokenizer=False, max_shard_size="40KB")


@pytest.fixture(scope="session")
def qwen2_folder(tmp_path_factory) -> Path:
    return save_hf(transformers.Qwen2ForCausalLM(qwen2_config()), tmp_path_factory.mktemp("qwen2"))


@pytest.fixture(scope="session")
def mixtral_folder(tmp_path_factory) -> Path:
    return save_hf(transformers.MixtralForCausalLM(mixtral_config()), tmp_path_factory.mktemp("mixtral"))


@pytest.fixture(scope="session")
def qwen2_moe_folder(tmp_path_factory) -> Path:
    return save_hf(transformers.Qwen2MoeForCausalLM(qwen2_moe_config()), tmp_path_factory.mktemp("qwen2_moe"))


def _family_folder(name: str):
    """The fixture ``<name>_folder`` of one of FAMILIES, made once for the whole test run."""

    @pytest.fixture(scope="session", name=f"{name}_folder")
    def folder(tmp_path_factory) -> Path:
        cls, config = FAMILIES[name]
        return save_hf(getattr(transformers, cls)(config()), tmp_path_factory.mktemp(name))

    return folder


for _name in FAMILIES:
    globals()[f"{_name}_folder"] = _family_folder(_name)


@pytest.fixture(params=["gpt2", "llama", "qwen2"])
def hf_folder(request) -> Path:
    return request.getfixturevalue(f"{request.param}_folder")


@pytest.fixture(params=["gpt2", "llama", "qwen2", "mixtral", "qwen2_moe", *FAMILIES])
def any_hf_folder(request) -> Path:
    """Every supported model_type, mixtures of experts included (model=moe)."""
    return request.getfixturevalue(f"{request.param}_folder")
