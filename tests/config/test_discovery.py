"""Discovery of user modules: a project's pyproject.toml, installed packages' entry points."""

from __future__ import annotations

import textwrap

import pytest

from examples.mymodels import ScaledBlock, ScaledGPT, ScaledMLP  # the README's example (registers scaled_gpt)
from support import run_python
from theseus.config import ConfigError, configuration, configure, field
from theseus.config.discovery import find_project
from theseus.model.layers import MLP
from theseus.model.module import Module



def test_nearest_pyproject_upwards_decides(tmp_path, monkeypatch):
    (tmp_path / "pyproject.toml").write_text('[tool.theseus]\nimports = ["a", "b"]\n')
    deep = tmp_path / "x" / "y"
    deep.mkdir(parents=True)
    project = find_project(deep)
    assert project.root == tmp_path.resolve() and project.imports == ("a", "b")
    (tmp_path / "x" / "pyproject.toml").write_text('[project]\nname = "other"\n')  # nearer, no [tool.theseus]
    assert find_project(deep) is None


def test_bad_imports_table_is_one_line(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.theseus]\nimports = "mymodels"\n')
    with pytest.raises(ConfigError, match=r"imports must be a list of module names, e\.g\. imports = \[\"mymodels\"\]"):
        find_project(tmp_path)


def test_entry_point_group_registers_an_installed_package(tmp_path):
    """A package installed with an entry point in group theseus.modules is imported by every
    entry point: its model is a choice, and its key is listed."""
    site = tmp_path / "site"
    (site / "acme").mkdir(parents=True)
    (site / "acme" / "__init__.py").write_text("")
    (site / "acme" / "models.py").write_text(textwrap.dedent("""
        from theseus.config import field, register
        from theseus.model.models.gpt import GPT

        @register("model", "acme_gpt")
        class AcmeGPT(GPT):
            acme_gain: float = field("architecture/acme_gain", default=1.5, help="acme's own knob")
    """))
    info = site / "acme-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[theseus.modules]\nacme = acme.models\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    proc = run_python("-m", "theseus.config", "model=acme_gpt", "architecture.acme_gain=2", cwd=work,
                      env={"PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    assert "acme_gain: 2" in proc.stdout and "model: acme_gpt" in proc.stdout
    (site / "acme" / "models.py").write_text("raise RuntimeError('acme is broken')\n")
    proc = run_python("-m", "theseus.config", cwd=work, env={"PYTHONPATH": str(site)})
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("theseus: error: cannot import 'acme.models', asked for by the entry point 'acme' "
                                   "of group theseus.modules (package acme): RuntimeError: acme is broken")


TINY = dict(vocab_size=64, n_layers=2, d_model=32, n_heads=2, seq_len=8)


def test_subclass_hooks_are_followed_by_components():
    assert ScaledBlock.components()[-1] is ScaledMLP and ScaledGPT.components()[2] is ScaledBlock
    assert ScaledMLP in ScaledGPT.gather() and MLP not in ScaledGPT.gather()


@pytest.mark.slow
@pytest.mark.parametrize("llama", [False, True])
def test_root_keyword_reaches_the_child_that_declares_it_under_jit(llama):
    """configure(ScaledGPT, ff_scale=3.0) sets architecture.ff_scale: the MLPs scale by 3, also
    when init and apply run under jit outside any configuration (GPT-2 and Llama-style)."""
    import jax
    import jax.numpy as jnp

    extra = dict(norm="rmsnorm", activation="swiglu", positions="rope", bias=False, n_kv_heads=1) if llama else {}
    scaled = configure(ScaledGPT, ff_scale=3.0, **TINY, **extra)
    with configuration({"architecture.ff_scale": 3.0}):
        via_context = configure(ScaledGPT, **TINY, **extra)
    plain = configure(ScaledGPT, **TINY, **extra)
    tokens = jnp.arange(8)[None] % 64
    params = jax.jit(plain.init)(jax.random.key(0), tokens)
    bound = scaled.bind(params)
    assert bound.h[0].mlp.ff_scale == 3.0 and plain.bind(params).h[0].mlp.ff_scale == 1.0
    out = {name: jax.jit(m.apply)(params, tokens) for name, m in
           (("scaled", scaled), ("context", via_context), ("plain", plain))}
    assert jnp.array_equal(out["scaled"], out["context"])
    assert not jnp.allclose(out["scaled"], out["plain"])


def test_root_keywords_by_key_and_their_errors():
    model = configure(ScaledGPT, **{"architecture.ff_scale": 2.0}, **TINY)
    assert model._config.get("architecture.ff_scale") == 2.0
    with pytest.raises(TypeError, match="unexpected keyword argument 'ff_scal'"):
        configure(ScaledGPT, ff_scal=2.0, **TINY)
    with pytest.raises(ConfigError, match="architecture.ff_scale must be float, got 'x'"):
        configure(ScaledGPT, ff_scale="x", **TINY)

    class Twice(Module):  # two keys share the attribute name "width"
        a: int = field("architecture/a/width", default=1)

        @classmethod
        def components(cls):
            return [Other]

    class Other(Module):
        width: int = field("architecture/b/width", default=1)

    class Root(Module):
        @classmethod
        def components(cls):
            return [Twice, Other, Third]

    class Third(Module):
        width: int = field("architecture/c/width", default=1)

    with pytest.raises(ConfigError, match=r"width= names several keys of its tree \(architecture\.b\.width, "
                                          r"architecture\.c\.width\)"):
        configure(Root, width=3)


class Counted(Module):
    """Counts through its bound child, as the seed's CountedFeedForward does."""

    @classmethod
    def components(cls):
        return [MLP]

    def setup(self):
        self.mlp = configure(MLP)

    def __call__(self, x, deterministic=True):
        return self.mlp(x, deterministic=deterministic)

    def flops(self, seq):
        return self.mlp.flops(seq)


class Outer(Module):
    """Counts through an unbound child, as GPT did."""

    @classmethod
    def components(cls):
        return [Counted]

    def flops(self, seq):
        return 2 * self.detached(Counted).flops(seq)


def test_one_flops_pattern_bound_or_unbound():
    mlp = configure(MLP, d_model=16)
    expected = 6 * 2 * 16 * 64 * 10
    assert mlp.flops(10) == expected
    assert configure(Counted, d_model=16).flops(10) == expected  # unbound: bound to abstract variables
    with configuration({"architecture.d_model": 16}):
        assert configure(Outer).flops(10) == 2 * expected


def test_unknown_model_says_how_to_make_a_module_visible():
    from theseus.config.compose import compose

    with pytest.raises(ConfigError, match=r"unknown model 'unscaled_gpt'.*\[tool\.theseus\] imports"):
        compose(["model=unscaled_gpt"])


def test_sweep_expansion_uses_hydra_as_it_is():
    """run.job_overrides leans on Hydra's BasicSweeper.split_arguments (private): this fails loudly
    should Hydra change it."""
    from theseus.cli.run import job_overrides

    jobs = job_overrides(["-m", "a.b=1,2", "c=x"], ["d=3,4"])
    assert sorted(map(sorted, jobs)) == sorted(sorted([f"d={d}", f"a.b={a}", "c=x"]) for d in (3, 4) for a in (1, 2))
    assert job_overrides(["-sc", "install=bash"]) == [[]]
