"""LoRA adapters against peft: the adapter folder ``theseus.export --adapter`` writes loads in
peft onto its base and computes the merged export's logits; untargeted tensors stay the base's."""

from __future__ import annotations

import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util
from interop.hf_models import hf_logits, target_of, theseus_model, torch, transformers
from interop.test_cli import train_args
from safetensors.numpy import load_file
from support import run_python

from theseus.cli.export import export_adapter
from theseus.config import ConfigError, configuration, configure
from theseus.interop.expressible import check_expressible
from theseus.interop.hf_config import arch_of, read_config
from theseus.interop.hf_weights import save, to_hf
from theseus.interop.peft_adapter import adapter_config, adapter_tensors, save_adapter
from theseus.model.lora import LoRA, merged, settings_of, without_adapters
from theseus.sources.parse import parse_source
from theseus.sources.weights import load_params

peft = pytest.importorskip("peft")

TARGETS = {"gpt2": ["q", "o", "up", "down"], "llama": ["q", "k", "v", "o", "gate", "up", "down"],
           "qwen2": ["k", "v", "down"], "phi3": ["q", "o", "up", "down"], "gemma3": ["q", "k", "v", "o", "gate", "up"]}
KINDS = {"gemma3": "gemma3_text"}  # a fixture's name -> its model_type, where they differ


def peft_model(base: Path, adapter: Path):
    model = transformers.AutoModelForCausalLM.from_pretrained(base).eval()
    return peft.PeftModel.from_pretrained(model, adapter).eval()


def peft_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(tokens)).logits.numpy()


def check_peft_holds_the_file(model, adapter: Path) -> None:
    """Every LoRA tensor peft holds is the file's (a key peft did not match would leave its own)."""
    held = {name: tensor.detach().numpy() for name, tensor in model.state_dict().items() if ".lora_" in name}
    stored = load_file(str(adapter / "adapter_model.safetensors"))
    assert len(held) == len(stored) > 0
    for name, value in stored.items():
        np.testing.assert_array_equal(held[name.replace(".weight", ".default.weight")], value)


def lora_model(folder: Path, targets: list[str]):
    """theseus's model of ``folder`` with rank-4 adapters on ``targets``, its base loaded and every
    adapter (B too) drawn at random: a trained adapter's stand-in."""
    base = theseus_model(folder)
    with configuration({**base.own_configuration().to_dict(), "architecture.lora.rank": 4,
                        "architecture.lora.alpha": 6.0, "architecture.lora.targets": targets}):
        model = configure(type(base))
    params = load_params(folder, arch_of(model), target_of(model))
    rng = np.random.default_rng(1)
    flat = {path: (rng.normal(0, 0.1, leaf.shape).astype(np.float32) if "/lora_" in path else leaf)
            for path, leaf in traverse_util.flatten_dict(jax.device_get(params), sep="/").items()}
    return model, traverse_util.unflatten_dict(flat, sep="/")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "phi3", "gemma3"])
def test_peft_loads_the_adapters_onto_the_base_and_computes_the_merged_model(name, request, tmp_path):
    """Each model_type's projections: peft's adapted model = theseus's adapted model = the
    merged weights (through the Hugging Face export's mapping), to 1e-4. Phi-3 stores q, k, v and
    gate, up fused, and its import fuses their adapters (q alone, up alone adapt the fused module)."""
    folder, kind = request.getfixturevalue(f"{name}_folder"), KINDS.get(name, name)
    model, params = lora_model(folder, TARGETS[name])
    lora = settings_of(model)
    tensors = adapter_tensors(kind, params)
    save_adapter(tmp_path, tensors, adapter_config(kind, lora, tensors, str(folder)))
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["fan_in_fan_out"]) == (4, 6.0, kind == "gpt2")
    if kind == "gpt2":  # q alone in targets adapts the fused c_attn, as one
        assert config["target_modules"] == ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
    if kind == "phi3":
        assert config["target_modules"] == ["mlp.down_proj", "mlp.gate_up_proj", "self_attn.o_proj",
                                            "self_attn.qkv_proj"]
    adapted = peft_model(folder, tmp_path)
    check_peft_holds_the_file(adapted, tmp_path)

    tokens = np.random.default_rng(0).integers(0, read_config(folder)["vocab_size"], size=(2, 16))
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(tokens)))
    theirs = peft_logits(adapted, tokens)
    base = hf_logits(folder, tokens)
    assert np.abs(theirs - base).max() > 1e-2  # the adapters change the model ...
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)  # ... as peft computes them

    plain = without_adapters(model)
    merged_params = merged(params, lora.scale)
    np.testing.assert_allclose(np.asarray(plain.apply({"params": merged_params}, jnp.asarray(tokens))), ours,
                               atol=1e-4, rtol=0)
    merged_hf = to_hf(kind, arch_of(plain), traverse_util.flatten_dict(merged_params, sep="/"),
                      read_config(folder)["vocab_size"])
    peft_merged = {name: tensor.detach().numpy() for name, tensor in adapted.merge_and_unload().state_dict().items()}
    for name, value in merged_hf.items():
        np.testing.assert_allclose(peft_merged[name], value, atol=1e-6, rtol=0, err_msg=name)


def test_a_hugging_face_base_loads_with_fresh_adapters(llama_folder):
    """The checkpoint holds no adapters: B starts at zero (the base's logits), A drawn as peft draws
    lora_A (uniform in +-1/sqrt(fan_in)), a scanned model's stacked A's one per layer."""
    base = theseus_model(llama_folder, scan_layers=True)
    with configuration({**base.own_configuration().to_dict(), "architecture.lora.rank": 4}):
        model = configure(type(base))
    params = load_params(llama_folder, arch_of(model), target_of(model))
    a, b = (np.asarray(params["h"]["attn"]["lora_v"][name]) for name in ("a", "b"))
    assert a.shape == (2, 64, 4) and b.shape == (2, 4, 2, 16)
    assert not b.any() and 0.1 < np.abs(a).max() <= 1 / 8 and not np.array_equal(a[0], a[1])
    tokens = np.random.default_rng(0).integers(0, 333, size=(2, 16))
    np.testing.assert_allclose(np.asarray(model.apply({"params": params}, jnp.asarray(tokens))),
                               hf_logits(llama_folder, tokens), atol=1e-4, rtol=0)


def test_a_run_without_adapters_exports_with_the_lora_keys_in_its_config(llama_folder):
    """A composed config holds every key, architecture.lora.targets at its default (a list, held
    as a tuple): the model still exports."""
    base = theseus_model(llama_folder)
    with configuration({**base.own_configuration().to_dict(), "architecture.lora.targets": ["q", "v"],
                        "architecture.lora.alpha": 8.0}):
        model = configure(type(base))
    assert model.own_configuration().get("architecture.lora.targets") == ("q", "v")
    assert check_expressible(model, nn.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4),
                                                                                                      jnp.int32)))
                             ["params"]) == "llama"


def test_adapter_export_refuses_a_run_without_adapters_or_base(llama_folder, tmp_path):
    model, params = lora_model(llama_folder, ["q"])
    with pytest.raises(ConfigError) as error:
        export_adapter(model, params, LoRA(), parse_source(llama_folder), tmp_path / "out")
    assert str(error.value) == ("--adapter: the run has no LoRA adapters (architecture.lora.rank=0): export it "
                                "without --adapter")
    with pytest.raises(ConfigError) as error:
        export_adapter(model, params, settings_of(model), None, tmp_path / "out")
    assert str(error.value) == ("--adapter writes adapters against the Hugging Face folder the run started from "
                                "(trainer.init_from), but it started from no weights: export it merged, without "
                                "--adapter")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_lora_fine_tune_exports_merged_and_as_a_peft_adapter(llama_folder, tmp_path, umask_022):
    """A user's path: LoRA on a Llama folder (2 steps, weight decay on, scanned layers, FSDP over
    4 devices), then
    ``theseus.export RUN OUT`` and ``--adapter``: peft on the base gives the merged export's
    logits; every tensor LoRA did not target is the base's bit for bit."""
    proc = run_python(*train_args(llama_folder, tmp_path, "architecture.lora.rank=4", "architecture.lora.alpha=8",
                                  "architecture.lora.targets=[q,v,down]", "optimizer.lr=3e-2",
                                  "optimizer.warmup_steps=0", "optimizer.weight_decay=0.5",
                                  "architecture.scan_layers=true", "mesh.cpu_devices=4", "mesh.data=1",
                                  "mesh.fsdp=4", "trainer.batch_size=4"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run, merged_out, adapter_out = tmp_path / "run", tmp_path / "merged", tmp_path / "adapter"
    for out, extra in ((merged_out, ()), (adapter_out, ("--adapter",))):
        proc = run_python("-m", "theseus.export", str(run), str(out), *extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in adapter_out.iterdir()} == \
        {"adapter_config.json": "0o644", "adapter_model.safetensors": "0o644"}  # readable as the umask lets files be
    config = json.loads((adapter_out / "adapter_config.json").read_text())
    assert (config["target_modules"], config["base_model_name_or_path"]) == \
        (["mlp.down_proj", "self_attn.q_proj", "self_attn.v_proj"], str(llama_folder))

    base, exported = load_file(str(llama_folder / "model.safetensors")), load_file(str(merged_out / "model.safetensors"))
    targeted = {name for name in base if name.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight"))}
    assert base.keys() == exported.keys()
    for name in base.keys() - targeted:
        assert base[name].tobytes() == exported[name].tobytes(), name  # frozen, not decayed
    for name in targeted:
        assert not np.array_equal(base[name], exported[name]), name  # trained

    adapted = peft_model(llama_folder, adapter_out)
    check_peft_holds_the_file(adapted, adapter_out)
    tokens = np.random.default_rng(0).integers(0, 333, size=(2, 32))
    np.testing.assert_allclose(peft_logits(adapted, tokens), hf_logits(merged_out, tokens), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe"])
def test_expert_adapters_merge_into_the_hugging_face_experts(kind, request, tmp_path):
    """LoRA on a mixture's experts (and its shared expert, Qwen2-MoE's): the merged export is the
    adapted model in transformers (1e-4); peft's format is refused in one line, nothing written."""
    folder = request.getfixturevalue(f"{kind}_folder")
    model, params = lora_model(folder, ["q", "gate", "up", "down"])
    tokens = np.random.default_rng(0).integers(0, read_config(folder)["vocab_size"], size=(2, 16))
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(tokens)))
    plain = without_adapters(model)
    tensors = to_hf(kind, arch_of(plain), traverse_util.flatten_dict(merged(params, settings_of(model).scale),
                                                                     sep="/"), read_config(folder)["vocab_size"])
    out = tmp_path / "merged"
    out.mkdir()
    (out / "config.json").write_text((folder / "config.json").read_text())
    save(tensors, out)
    assert np.abs(ours - hf_logits(folder, tokens)).max() > 1e-2  # the adapters change the model ...
    np.testing.assert_allclose(hf_logits(out, tokens), ours, atol=1e-4, rtol=0)  # ... as the merged export computes
    with pytest.raises(ConfigError) as error:
        export_adapter(model, params, settings_of(model), parse_source(folder), tmp_path / "adapter")
    layer = "h_0" if kind == "mixtral" else "h_1"  # Qwen2-MoE's first layer is dense
    assert str(error.value) == (f"--adapter: adapter {layer}/mlp/lora_expert_down adapts a mixture's experts, which "
                                f"peft's LoRA format does not hold as theseus trains them (one A and B per expert and "
                                f"projection): export it merged (without --adapter)")
    assert not (tmp_path / "adapter").exists()


def test_adapters_a_phi3_model_does_not_store_are_refused_in_one_line(phi3_folder, tmp_path):
    """A Phi-3 run whose q, k, v adapters were kept apart (architecture.fused_projections=false):
    peft's qkv_proj holds one adapter, so --adapter refuses, naming what Phi-3's are."""
    base = theseus_model(phi3_folder)
    with configuration({**base.own_configuration().to_dict(), "architecture.lora.rank": 4,
                        "architecture.fused_projections": False}):
        model = configure(type(base))
    params = load_params(phi3_folder, arch_of(model), target_of(model))
    with pytest.raises(ConfigError) as error:
        export_adapter(model, params, settings_of(model), parse_source(phi3_folder), tmp_path / "out")
    assert str(error.value) == (
        "adapter h_0/attn/lora_q has no place in a Hugging Face phi3 model (its adapters: q+k+v (self_attn.qkv_proj), "
        "o (self_attn.o_proj), gate+up (mlp.gate_up_proj), down (mlp.down_proj); architecture.fused_projections "
        "fuses them): export it merged (without --adapter)")
    assert not (tmp_path / "out").exists()
