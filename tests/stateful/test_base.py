"""The BaseModule contract (the seed, method by method) and Model: chains, serialization, files."""

from __future__ import annotations

import io
import json
import pickle
import textwrap
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support import run_python

import theseus
from theseus.config import ConfigError, configuration, configure, field, schema_of
from theseus.stateful.base import BaseModule, precision_bits
from theseus.stateful.model import Model
from theseus.stateful import AffineEigenvaluePMM, Flatten, Linear, ReLU, Tanh

KEY = jax.random.key(0)


class Scale(BaseModule):
    """Written from the seed alone: ``y = x * w`` (w may be complex); state counts training calls."""

    def __init__(self, features: int | None = None):
        self.features = features
        self.w = self.count = None

    def is_ready(self):
        return self.w is not None

    def _get_callable(self):
        def scale(params, x, training, state, rng):
            (w,), (count,) = params, state
            return x * w, ((count + 1,) if training else state)

        return scale

    def compile(self, rng, input_shape):
        self.features = input_shape[0]
        self.w, self.count = jax.random.normal(rng, input_shape), jnp.zeros(())

    def get_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_hyperparameters(self):
        return {"features": self.features}

    def get_params(self):
        return (self.w,)

    def set_params(self, params):
        (self.w,) = params

    def get_state(self):
        return (self.count,)

    def set_state(self, state):
        (self.count,) = state


def compiled(module, shape=(3,)):
    module.compile(KEY, shape)
    return module


# -- the seed's methods, one by one --------------------------------------------------------------


def test_base_module_is_not_instantiable():
    with pytest.raises(NotImplementedError, match="BaseModule is not meant to be instantiated directly"):
        BaseModule()


class Bare(BaseModule):
    """Overrides nothing."""


@pytest.mark.parametrize(
    "call",
    [
        lambda m: m.is_ready(),
        lambda m: m._get_callable(),
        lambda m: m.compile(KEY, (3,)),
        lambda m: m.get_output_shape((3,)),
        lambda m: m.get_params(),
        lambda m: m.set_params(()),
    ],
    ids=["is_ready", "_get_callable", "compile", "get_output_shape", "get_params", "set_params"],
)
def test_methods_to_override_raise_not_implemented(call):
    with pytest.raises(NotImplementedError, match="Bare must implement"):
        call(Bare())


def test_a_module_must_construct_without_arguments():
    with pytest.raises(TypeError, match=r"Needy\(\) requires n: a BaseModule must construct with no arguments"):
        class Needy(BaseModule):
            def __init__(self, n):
                self.n = n

    with pytest.raises(TypeError, match=r"Fieldy\(\) requires width"):
        class Fieldy(BaseModule):
            width: int = field("architecture/fieldy/width", help="no default")


def test_call_runs_the_forward_pass_with_own_state():
    module = compiled(Scale())
    x = jnp.arange(6.0).reshape(2, 3)
    y, state = module(x)
    np.testing.assert_allclose(y, x * module.w)
    assert state == (module.count,)
    _, (count,) = module(x, training=True)
    assert count == 1 and module.count == 0  # the new state is returned, not stored


def test_call_before_compile_raises_value_error():
    with pytest.raises(ValueError, match=r"Linear is not ready: call compile\(rng, input_shape\) first"):
        Linear()(jnp.ones((2, 3)))


def test_name_and_repr():
    assert Scale().name() == "Scale" and Linear().name() == "Linear"
    assert repr(Scale()) == "Scale(not ready)"
    assert repr(compiled(Scale())) == "Scale(3 trainable floats, ready)"
    assert repr(ReLU()) == "ReLU(ready)"


def test_num_trainable_floats():
    module = Scale()
    assert module.get_num_trainable_floats() is None
    module.set_params((jnp.ones((2, 3), jnp.complex64),))
    assert module.get_num_trainable_floats() == 12  # a complex number counts as two
    assert compiled(Linear(width=4), (5,)).get_num_trainable_floats() == 5 * 4 + 4
    assert ReLU().get_num_trainable_floats() == 0


def test_hyperparameters_get_and_set():
    linear = Linear(width=4)
    assert linear.get_hyperparameters() == {"width": 4, "bias": True}
    linear.set_hyperparameters({"width": 7})
    assert linear.get_hyperparameters() == {"width": 7, "bias": True}
    scale = Scale()
    scale.set_hyperparameters({"features": 5})  # the default: setattr
    assert scale.features == 5


@pytest.mark.parametrize("bad", [[("width", 3)], "width=3", None])
def test_set_hyperparameters_needs_a_dict(bad):
    with pytest.raises(TypeError, match="hyperparameters must be a dict"):
        Linear().set_hyperparameters(bad)


def test_set_hyperparameters_checks_names_and_types():
    with pytest.raises(ValueError, match="Linear has no hyperparameter widht; it has width, bias"):
        Linear().set_hyperparameters({"widht": 3})
    with pytest.raises(ConfigError, match="architecture.linear.width must be int, got 'abc'"):
        Linear().set_hyperparameters({"width": "abc"})


def test_hyperparameters_are_config_fields():
    assert {"architecture.linear.width", "architecture.linear.bias"} <= set(schema_of(Linear))
    assert {"architecture.pmm.n", "architecture.pmm.k"} <= set(schema_of(AffineEigenvaluePMM))
    with configuration({"architecture.linear.width": 5, "architecture.pmm.n": 3}):
        assert configure(Linear).width == 5 and configure(AffineEigenvaluePMM).n == 3
    assert configure(Linear).width == 1  # no active config: the defaults


def test_state_defaults_to_empty():
    relu = ReLU()
    assert relu.get_state() == ()
    relu.set_state(())
    with pytest.raises(ValueError, match="ReLU has no state, got 1 arrays"):
        relu.set_state((jnp.ones(2),))


# -- precision ------------------------------------------------------------------------------------

SINGLE = [np.float32, np.complex64, "float32", "complex64", "single", "f32", "c64", 32]
DOUBLE = [np.float64, np.complex128, "float64", "complex128", "double", "f64", "c128", 64]


@pytest.mark.parametrize("prec", SINGLE)
def test_set_precision_32(prec):
    module = compiled(Scale())
    module.set_params((jnp.ones(3, jnp.bfloat16),))
    assert module.astype(prec) is module
    assert module.w.dtype == jnp.float32 and module.count.dtype == jnp.float32
    module.set_params((jnp.ones(3, jnp.complex64),))
    module.set_precision(prec)
    assert module.w.dtype == jnp.complex64  # complex stays complex


@pytest.mark.parametrize("prec", ["float16", 16, "half", "F32", "float", np.int32, None, True, [32]])
def test_set_precision_rejects_other_values(prec):
    with pytest.raises(ValueError, match="invalid precision"):
        compiled(Scale()).set_precision(prec)
    with pytest.raises(ValueError, match="invalid precision"):
        compiled(Scale()).astype(prec)


def test_set_precision_needs_a_ready_module():
    with pytest.raises(RuntimeError, match="Scale is not ready"):
        Scale().set_precision(32)
    with pytest.raises(RuntimeError, match="Linear is not ready"):
        Linear().astype("f32")


PRECISION_SCRIPT = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from theseus.model.layers import MLP
    from theseus.stateful import AffineEigenvaluePMM, FlaxAdapter, Linear, Model

    def dtypes(module, x):
        return sorted({str(p.dtype) for p in jax.tree.leaves(module.get_params())} | {str(module(x)[0].dtype)})

    DOUBLE = [np.float64, np.complex128, "float64", "complex128", "double", "f64", "c128", 64]
    modules = [(Model([Linear(width=3), AffineEigenvaluePMM(n=3, k=2)]), (4,)),
               (FlaxAdapter(MLP(d_model=2, d_ff=4)), (3, 2))]
    out = {"x64": jax.config.jax_enable_x64, "errors": [], "dtypes": []}
    for module, shape in modules:
        module.compile(jax.random.key(0), shape)
        for prec in DOUBLE:
            try:
                module.set_precision(prec)
            except ValueError as exc:
                out["errors"].append(str(exc))
                continue
            wide = dtypes(module, jnp.ones((5, *shape), jnp.float64))
            out["dtypes"].append([wide, dtypes(module.astype(32), jnp.ones((5, *shape), jnp.float32))])
    print(json.dumps(out))
""")


@pytest.mark.slow
@pytest.mark.parametrize("x64", [False, True])
def test_set_precision_64_depends_on_jax_enable_x64(x64):
    result = run_python("-c", PRECISION_SCRIPT, env={"JAX_ENABLE_X64": "1" if x64 else "0"}, timeout=120)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.splitlines()[-1])
    assert out["x64"] is x64
    if x64:
        assert out["errors"] == []
        assert out["dtypes"] == [[["float64"], ["float32"]]] * 2 * len(DOUBLE)
    else:
        assert out["dtypes"] == []
        assert len(out["errors"]) == 2 * len(DOUBLE)
        assert all("64-bit precision needs JAX_ENABLE_X64=1" in e for e in out["errors"])


def test_precision_bits():
    assert {precision_bits(p) for p in SINGLE} == {32}
    assert precision_bits(np.dtype("float32")) == precision_bits(jnp.complex64) == 32


# -- the pure forward pass -----------------------------------------------------------------------


def test_callable_jits_and_differentiates():
    model = compiled(Model([Linear(width=2), Tanh(), Linear(width=1)]), (3,))
    forward = model._get_callable()
    params, x = model.get_params(), jax.random.normal(KEY, (4, 3))
    eager, _ = forward(params, x, False, model.get_state(), None)
    jitted, _ = jax.jit(forward, static_argnums=2)(params, x, False, model.get_state(), None)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)

    # d/dW1 sum(tanh(x W0 + b0) W1 + b1) = sum over samples of tanh(x W0 + b0), independently
    grads = jax.grad(lambda p: forward(p, x, True, model.get_state(), None)[0].sum())(params)
    (w0, b0), (), (w1, b1) = params
    hidden = np.tanh(np.asarray(x) @ np.asarray(w0) + np.asarray(b0))
    np.testing.assert_allclose(grads[2][0], hidden.sum(0)[:, None], rtol=1e-5)
    np.testing.assert_allclose(grads[2][1], [len(x)], rtol=1e-6)


# -- Model -----------------------------------------------------------------------------------------


def test_model_compiles_by_passing_shapes_along():
    model = Model([Flatten(), Linear(width=4), ReLU(), AffineEigenvaluePMM(n=3, k=2), Linear(width=1)])
    assert model.input_shapes((2, 5)) == [(2, 5), (10,), (4,), (4,), (2,), (1,)]
    model.compile(KEY, (2, 5))
    assert [p.shape for p in model.modules[1].get_params()] == [(10, 4), (4,)]
    assert [p.shape for p in model.modules[3].get_params()] == [(3, 3), (4, 3, 3)]
    assert model(jnp.ones((7, 2, 5)))[0].shape == (7, 1)
    assert repr(model).splitlines() == [
        "Model(92 trainable floats, ready)",
        "  0: Flatten(ready)",
        "  1: Linear(44 trainable floats, ready)",
        "  2: ReLU(ready)",
        "  3: AffineEigenvaluePMM(45 trainable floats, ready)",
        "  4: Linear(3 trainable floats, ready)",
    ]


def test_model_shape_mismatch_names_module_class_and_shapes():
    with pytest.raises(ValueError, match=r"module 1 \(Linear\) cannot take input shape \(2, 5\) \(module 0's output\): "
                                         r"Linear expects input shape \(features,\), got \(2, 5\)"):
        Model([ReLU(), Linear(width=2)]).compile(KEY, (2, 5))


def test_model_checks_its_parts():
    with pytest.raises(TypeError, match="a Model chains BaseModules, got int"):
        Model([Linear(), 3])
    model = compiled(Model([Linear(width=2), ReLU()]))
    with pytest.raises(ValueError, match="Model has 2 modules, got params for 1"):
        model.set_params(model.get_params()[:1])
    with pytest.raises(ValueError, match="Model has 2 modules, got state for 3"):
        model.set_state(((), (), ()))


def test_model_hyperparameters_rebuild_the_chain():
    model = Model([Linear(width=3, bias=False), Tanh(), AffineEigenvaluePMM(n=2, k=2)])
    rebuilt = Model()
    rebuilt.set_hyperparameters(model.get_hyperparameters())
    assert [type(m) for m in rebuilt.modules] == [Linear, Tanh, AffineEigenvaluePMM]
    assert rebuilt.get_hyperparameters() == model.get_hyperparameters()
    assert not rebuilt.is_ready()
    with pytest.raises(ValueError, match="unknown BaseModule class 'os.system'"):
        Model().set_hyperparameters({"modules": [{"class": "os.system", "hyperparameters": {}}]})


# -- serialization ---------------------------------------------------------------------------------


def test_serialize_deserialize_gives_equal_outputs():
    module = compiled(Scale())
    x = jax.random.normal(KEY, (4, 3))
    data = module.serialize()
    assert set(data) == {"name", "version", "hyperparameters", "params", "state"}
    assert data["name"] == "Scale" and data["version"] == theseus.__version__
    assert data["hyperparameters"] == {"features": 3}
    copy = Scale()
    copy.deserialize(data)
    assert copy.features == 3
    np.testing.assert_array_equal(copy(x)[0], module(x)[0])


def test_deserialize_refuses_bad_data():
    data = compiled(Scale()).serialize()
    for key in data:
        with pytest.raises(ValueError, match=f"serialized Scale lacks {key}"):
            Scale().deserialize({k: v for k, v in data.items() if k != key})
    for version in ("1.0.0", "0.2.0", "banana", None):
        with pytest.raises(ValueError, match="cannot read"):
            Scale().deserialize({**data, "version": version})
    with pytest.raises(ValueError, match="serialized data is a 'Linear', not a 'Scale'"):
        Scale().deserialize({**data, "name": "Linear"})
    with pytest.raises(ValueError, match="must be a dict"):
        Scale().deserialize([data])
    patch = Scale()
    patch.deserialize({**data, "version": theseus.__version__.rpartition(".")[0] + ".99"})  # a patch release reads
    assert patch.is_ready()


def test_save_load_round_trip(tmp_path):
    model = compiled(Model([Flatten(), Linear(width=4), ReLU(), AffineEigenvaluePMM(n=3, k=2), Linear(width=1)]), (2, 3))
    path = tmp_path / "model.npz"
    model.save(path)
    loaded = Model.load(path)
    x = jax.random.normal(KEY, (5, 2, 3))
    np.testing.assert_array_equal(loaded(x)[0], model(x)[0])
    assert loaded.get_hyperparameters() == model.get_hyperparameters()
    assert repr(loaded) == repr(model)
    with zipfile.ZipFile(path) as archive:  # plain JSON and .npy arrays
        names = archive.namelist()
        metadata = json.loads(archive.read("metadata.json"))
    assert names == ["metadata.json", *(f"arrays/{i}.npy" for i in range(6))]
    assert metadata["name"] == "Model"


def test_save_keeps_dtypes(tmp_path):
    module = Scale(features=3)
    module.set_params((jnp.asarray([1.5, -2.0, 3.25], jnp.bfloat16),))
    module.set_state((jnp.asarray(7, jnp.int32),))
    Model([module]).save(tmp_path / "m.npz")
    (loaded,) = Model.load(tmp_path / "m.npz").modules
    assert loaded.w.dtype == jnp.bfloat16 and loaded.count.dtype == jnp.int32
    assert loaded.w.tolist() == [1.5, -2.0, 3.25] and loaded.count == 7


class Trap:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):  # unpickling this would create a file
        return open, (str(self.path), "w")


def test_loading_an_untrusted_file_executes_nothing(tmp_path):
    good = tmp_path / "good.npz"
    compiled(Model([Linear(width=2)])).save(good)
    with zipfile.ZipFile(good) as archive:
        metadata = json.loads(archive.read("metadata.json"))
        arrays = {name: archive.read(name) for name in archive.namelist() if name.startswith("arrays/")}

    def forge(name, metadata, **replaced):
        with zipfile.ZipFile(tmp_path / name, "w") as archive:
            archive.writestr("metadata.json", json.dumps(metadata))
            for member, data in {**arrays, **replaced}.items():
                archive.writestr(member, data)
        return tmp_path / name

    marker = tmp_path / "pwned"
    trap = io.BytesIO()  # an array only pickle could read, whose unpickling creates a file
    np.lib.format.write_array(trap, np.array([Trap(marker)], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Object arrays cannot be loaded when allow_pickle=False"):
        Model.load(forge("pickled.npz", metadata, **{"arrays/0.npy": trap.getvalue()}))
    assert not marker.exists()
    pickle.loads(pickle.dumps(Trap(marker))).close()
    assert marker.exists()  # the trap is real

    metadata["hyperparameters"]["modules"][0]["class"] = "subprocess.Popen"  # looked up, never imported
    with pytest.raises(ValueError, match="unknown BaseModule class 'subprocess.Popen'"):
        Model.load(forge("named.npz", metadata))

    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="is not a saved theseus Model"):
        Model.load(tmp_path / "junk.npz")


USER_MODULE = textwrap.dedent('''
    import jax, jax.numpy as jnp
    from theseus.config import field
    from theseus.stateful.base import BaseModule

    class Shift(BaseModule):
        """A user's module: y = x + c, c trainable."""
        offset: float = field("architecture/shift/offset", default=0.0, help="initial shift")

        def __post_init__(self):
            self.c = None
        def is_ready(self):
            return self.c is not None
        def compile(self, rng, input_shape):
            self.c = jnp.full(input_shape, self.offset)
        def get_output_shape(self, input_shape):
            return tuple(input_shape)
        def get_params(self):
            return (self.c,)
        def set_params(self, params):
            (self.c,) = params
        def _get_callable(self):
            return lambda params, x, training, state, rng: (x + params[0], state)
''')

LOAD_ELSEWHERE = textwrap.dedent("""
    import json, sys
    import jax.numpy as jnp
    import user_shift  # the user's module must be imported; theseus's own load by themselves
    from theseus.stateful.model import Model

    print(json.dumps(Model.load(sys.argv[1])(jnp.ones((2, 2)))[0].tolist()))
""")


@pytest.mark.slow
def test_a_users_module_trains_saves_and_loads_elsewhere(tmp_path, monkeypatch):
    (tmp_path / "user_shift.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from user_shift import Shift

    model = Model([Linear(width=3), Shift(offset=0.5)])
    x = np.random.default_rng(0).normal(size=(64, 2)).astype(np.float32)
    model.fit(x, x @ np.ones((2, 3), np.float32) + 1.0, epochs=20, lr=0.05, val_fraction=0.0)
    model.save(tmp_path / "model.npz")
    result = run_python("-c", LOAD_ELSEWHERE, str(tmp_path / "model.npz"), cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(json.loads(result.stdout), model(jnp.ones((2, 2)))[0], rtol=1e-6)
