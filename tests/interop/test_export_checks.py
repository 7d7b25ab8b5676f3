"""Export writes only what a Hugging Face model computes exactly: a config key without an
equivalent, a parameter without a place, or a user's model class computing something else is
refused in one line, before anything is written."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from support import ROOT, run_python
from theseus.config import RUNTIME, ConfigError, configuration, configure, field
from theseus.interop.expressible import check_expressible
from theseus.interop.hf_config import arch_of
from theseus.interop.hf_weights import to_hf
from theseus.model.layers import MLP, Block
from theseus.model.models.gpt import GPT, stack_layers
from theseus.model.models.moe_gpt import MoEGPT

TINY = {"architecture.vocab_size": 50, "architecture.seq_len": 16, "architecture.n_layers": 2,
        "architecture.d_model": 32, "architecture.n_heads": 4}
LLAMA = {**TINY, "architecture.norm": "rmsnorm", "architecture.activation": "swiglu", "architecture.positions": "rope",
         "architecture.bias": False, "architecture.tie_embeddings": False, "architecture.n_kv_heads": 2}


class ReluMLP(MLP):
    """Another nonlinearity, hard-coded: no config key says so."""

    def __call__(self, x, deterministic=True):
        h = jax.nn.relu(jnp.einsum("bsd,df->bsf", x, self.w_inputs["up"]) + self.b_inputs["up"])
        return jnp.einsum("bsf,fd->bsd", h, self.w_out) + self.b_out


class UnbiasedMLP(MLP):
    """The MLP without its biases, whatever architecture.bias says."""

    def setup(self):
        self.w_up = self.param("w_up", nn.initializers.normal(0.02), (self.d_model, self.hidden))
        self.w_out = self.param("w_out", nn.initializers.normal(0.02), (self.hidden, self.d_model))

    def __call__(self, x, deterministic=True):
        return jax.nn.gelu(x @ self.w_up, approximate=True) @ self.w_out


class GatedMLP(MLP):
    """An extra parameter (a learned output gate)."""

    def setup(self):
        super().setup()
        self.gate = self.param("gate", nn.initializers.ones, (self.d_model,))

    def __call__(self, x, deterministic=True):
        return self.gate * super().__call__(x, deterministic)


def gpt_with(mlp: type[MLP]) -> type[GPT]:
    block = type(f"{mlp.__name__}Block", (Block,), {"mlp_cls": mlp})
    return type(f"{mlp.__name__}GPT", (GPT,), {"block_cls": block})


def built(cls: type[GPT], config: dict = TINY, **kwargs) -> tuple[GPT, dict]:
    """(model, params): params shaped as init's, drawn with numpy (std 0.3)."""
    with configuration(config):
        model = configure(cls, **kwargs)
    rng = np.random.default_rng(0)
    abstract = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))["params"]
    return model, jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.3, s.shape), s.dtype), abstract)


@pytest.mark.parametrize(("cls", "config", "kwargs", "kind"), [
    (GPT, TINY, {}, "gpt2"),
    (GPT, LLAMA, {"scan_layers": True}, "llama"),  # scanned: compared unstacked
    (GPT, {**LLAMA, "architecture.qkv_bias": True}, {}, "qwen2"),
    (type("Renamed", (GPT,), {}), TINY, {}, "gpt2"),  # a subclass that changes nothing
])
def test_what_maps_exactly_exports(cls, config, kwargs, kind):
    model, params = built(cls, config, **kwargs)
    assert check_expressible(model, params) == kind


@pytest.mark.parametrize(("mlp", "message"), [
    (ReluMLP, r"ReluMLPGPT computes other logits than theseus's GPT from the same parameters \(by up to [0-9.e-]+ on "
              r"a probe batch\): a Hugging Face gpt2 model would not compute what it does"),
    (UnbiasedMLP, "UnbiasedMLPGPT has no parameter h_0/mlp/b_out, which a Hugging Face gpt2 model has: export writes "
                  "only what transformers computes exactly"),
    (GatedMLP, "parameter h_0/mlp/gate of GatedMLPGPT has no place in a Hugging Face gpt2 model: export writes only "
               "what transformers computes exactly"),
])
def test_a_user_class_that_computes_otherwise_is_refused(mlp, message):
    model, params = built(gpt_with(mlp))
    with pytest.raises(ConfigError, match=message):
        check_expressible(model, params)


def test_a_non_default_key_without_equivalent_is_refused():
    """rope_theta means nothing to GPT-2 (learned positions): config.json cannot carry it."""
    model, params = built(GPT, {**TINY, "architecture.rope_theta": 500.0})
    with pytest.raises(ConfigError, match=r"^architecture.rope_theta=500.0 has no equivalent in a Hugging Face gpt2 "
                                          r"config.json \(declared by GPT; only its default, 10000.0, exports\)"):
        check_expressible(model, params)


class TracedMLP(MLP):
    """A key of the user's that changes how the model runs (here: nothing at all), not what it computes."""

    trace: bool = field("architecture.trace_mlp", default=False, role=RUNTIME, help="name the MLP's ops in a profile")


def test_a_users_runtime_key_exports_at_any_value_and_one_without_the_role_does_not():
    assert check_expressible(*built(gpt_with(TracedMLP), {**TINY, "architecture.trace_mlp": True})) == "gpt2"

    class Untagged(MLP):
        trace: bool = field("architecture.trace_mlp", default=False)

    with pytest.raises(ConfigError, match=r"^architecture.trace_mlp=True has no equivalent in a Hugging Face gpt2"):
        check_expressible(*built(gpt_with(Untagged), {**TINY, "architecture.trace_mlp": True}))


def test_bias_balanced_routing_is_refused_for_mixtral():
    """Mixtral routes by the router's probabilities alone: a learned selection bias has no place."""
    mixtral = {**LLAMA, "architecture.moe.n_experts": 4, "architecture.moe.capacity_factor": None}
    assert check_expressible(*built(MoEGPT, mixtral)) == "mixtral"
    with pytest.raises(ConfigError, match=r"^architecture.moe.bias_update_rate=0.001 has no equivalent in a Hugging "
                                          r"Face mixtral config.json \(declared by MoEGPT; only its default, 0.0"):
        check_expressible(*built(MoEGPT, {**mixtral, "architecture.moe.bias_update_rate": 0.001}))


def test_a_stacked_tree_passed_unrolled_is_refused_by_the_mapping():
    """The weight mapping itself names a parameter it needs and does not find."""
    model, params = built(GPT)
    flat = traverse_util.flatten_dict(stack_layers(params), sep="/")
    with pytest.raises(ConfigError, match="the Hugging Face gpt2 mapping needs parameter h_0/attn/wq, which the "
                                          "model lacks"):
        to_hf("gpt2", arch_of(model), flat, 50)


# -- the README's own ScaledGPT, in a user's project folder ------------------------------------

LOGITS = textwrap.dedent("""
    import sys
    import numpy as np
    from pathlib import Path
    from theseus.cli.trained import load_trained

    run = load_trained(Path(sys.argv[1]))
    tokens = np.load(sys.argv[2])
    np.save(sys.argv[3], np.asarray(run.model.apply({"params": run.params}, tokens))[..., :257])
""")


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("myproj")
    (root / "mymodels.py").write_text((ROOT / "tests" / "examples" / "mymodels.py").read_text())
    (root / "pyproject.toml").write_text('[project]\nname = "myproj"\nversion = "0.1"\n\n'
                                         '[tool.theseus]\nimports = ["mymodels"]\n')
    (root / "corpus.txt").write_text((ROOT / "theseus" / "training" / "trainer.py").read_text() * 2)
    return root


def train(project: Path, ff_scale: str) -> Path:
    run = project / f"run{ff_scale}"
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tiny", "model=scaled_gpt",
                      f"architecture.ff_scale={ff_scale}",
                      "data.source=text", "data.path=corpus.txt", "data.tokenizer=byte",
                      f"data.cache_dir={project / 'cache'}", "trainer.max_steps=2", "trainer.eval_every=0",
                      "logger.mode=disabled", f"hydra.run.dir={run}", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.mark.slow
def test_scaled_gpt_at_ff_scale_2_is_refused_in_one_line(project):
    run = train(project, "2")
    proc = run_python("-m", "theseus.export", str(run), str(project / "out"), cwd=project)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("theseus: error: architecture.ff_scale=2.0 has no equivalent in a Hugging Face gpt2 "
                                   "config.json (declared by ScaledMLP; only its default, 1.0, exports): export writes "
                                   "only what transformers computes exactly")
    assert not (project / "out").exists()


@pytest.mark.slow
def test_scaled_gpt_at_ff_scale_1_exports_what_it_computes(project):
    """At its default the scale multiplies by 1.0, exactly GPT's MLP: transformers computes the
    run's logits."""
    from interop.hf_models import hf_logits

    run = train(project, "1")
    out = project / "out1"
    proc = run_python("-m", "theseus.export", str(run), str(out), cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"
    tokens = np.random.default_rng(0).integers(0, 257, size=(2, 64))
    np.save(project / "tokens.npy", tokens)
    (project / "logits.py").write_text(LOGITS)
    proc = run_python("logits.py", str(run), "tokens.npy", "ours.npy", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = np.load(project / "ours.npy")
    assert np.abs(ours).max() > 0.1
    np.testing.assert_allclose(ours, hf_logits(out, tokens), atol=1e-4, rtol=0)


def test_a_parameter_the_weight_mapping_leaves_unused_is_refused():
    model, params = built(GPT)
    flat = {**traverse_util.flatten_dict(params, sep="/"), "h_0/mlp/gate": np.ones(32, np.float32)}
    with pytest.raises(ConfigError, match=r"^parameter h_0/mlp/gate \(and 0 more\) has no place in a Hugging Face "
                                          r"gpt2 checkpoint$"):
        to_hf("gpt2", arch_of(model), flat, 50)
