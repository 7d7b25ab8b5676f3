"""Whether a theseus model is exactly what a Hugging Face model_type computes, checked before export writes it.

    kind = check_expressible(model, params)  # "gpt2", "llama", "gemma2"...; ConfigError naming what is not

A model exports when its config, its parameters and (for a class other than theseus's GPT) its
behaviour all map:

- every config key of its component tree has an equivalent in that model_type's config.json
  (``hf_config.expressed``), does not change the function computed (declared ``role=RUNTIME``:
  dropout, initialisation, kernels, remat, layer layout, dtypes), or is at its default;
- its parameters are theseus's GPT's, path for path and shape for shape (each of which the
  weight mapping carries over: ``hf_weights.to_hf``);
- a subclass (a user's model, whose methods may compute anything) gives the logits theseus's GPT
  gives from the same parameters on a probe batch: the parity of that GPT with transformers is
  tested, the subclass's is not.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from theseus.config import RUNTIME, ConfigError, configuration, configure
from theseus.config.fields import MISSING
from theseus.config.schema import schema_of
from theseus.interop.hf_config import FORMATS, arch_of, expressed, model_type
from theseus.model.models.gpt import GPT, unstack_layers
from theseus.model.models.moe_gpt import MoEGPT

STOCK = {"gpt": GPT, "moe": MoEGPT}  # each Format.model's class
PROBE = (2, 32)  # [batch, seq] tokens the behaviour check compares logits on (seq: at most seq_len)
TOLERANCE = 1e-5  # the largest logit difference allowed, relative to the largest logit (float32)


def check_expressible(model: Any, params: Any, prefer: str | None = None) -> str:
    """The model_type whose Hugging Face model computes exactly what ``model`` computes with
    ``params`` (its param tree, stacked when it scans its layers; ``prefer``, when it does: the
    model_type the run was imported from); ConfigError in one line naming the first thing that
    has no equivalent."""
    kind = expressed_as(model, prefer)
    stock = _stock(model, kind)
    _check_parameters(model, params, stock, kind)
    if type(model) is not type(stock):
        _check_behaviour(model, params, stock, kind)
    return kind


def expressed_as(model: Any, prefer: str | None = None) -> str:
    """The model_type whose config.json expresses ``model``'s configuration (``prefer`` where
    several do; its parameters and behaviour aside: ``check_expressible`` checks those);
    ConfigError in one line naming what has none."""
    if not isinstance(model, GPT):
        raise ConfigError(f"export writes GPT models (theseus.model.models.gpt.GPT and its subclasses); "
                          f"{type(model).__module__}.{type(model).__name__} is not one")
    kind = model_type(arch_of(model), prefer)
    _check_keys(model, kind)
    return kind


def exportable(model: Any) -> bool:
    """Whether some model_type's config.json expresses ``model``'s configuration (the one a run was
    imported from, or any other): what ``theseus.export`` needs before it reads the parameters."""
    for kind in FORMATS:
        try:
            expressed_as(model, kind)
        except ConfigError:
            continue
        return True
    return False


def _check_keys(model: GPT, kind: str) -> None:
    """Every config key of the model's tree is expressed by ``kind``, changes nothing, or is at its default."""
    values = model.own_configuration()
    for key, spec in schema_of(type(model)).items():
        if key.removeprefix("architecture.") in expressed(kind) or spec.role == RUNTIME:
            continue
        value = values.get(key)
        if value is not MISSING and _plain(value) != _plain(spec.default):
            raise ConfigError(f"{key}={value} has no equivalent in a Hugging Face {kind} config.json "
                              f"(declared by {spec.owner.__name__}; only its default, {spec.default!r}, exports): "
                              f"export writes only what transformers computes exactly")


def _plain(value: Any) -> Any:
    """A list as the tuple a configuration holds it as (``architecture.lora.targets``)."""
    return tuple(value) if isinstance(value, list) else value


def _stock(model: GPT, kind: str) -> GPT:
    """theseus's own model of ``kind`` (GPT, or MoEGPT) with the model's configuration, unrolled
    and computing in float32."""
    with configuration(model.own_configuration()):
        return configure(STOCK[FORMATS[kind].model], scan_layers=False, activation_dtype="float32")


def _check_parameters(model: GPT, params: Any, stock: GPT, kind: str) -> None:
    """``params`` are the stock GPT's, path for path and shape for shape."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    expected = _shapes(nn.unbox(jax.eval_shape(stock.init, jax.random.key(0), tokens))["params"])
    given = _shapes(_unrolled(model, params))
    name = type(model).__name__
    for path in sorted(set(expected) | set(given)):
        if path not in given:
            raise ConfigError(f"{name} has no parameter {path}, which a Hugging Face {kind} model has: "
                              f"export writes only what transformers computes exactly")
        if path not in expected:
            raise ConfigError(f"parameter {path} of {name} has no place in a Hugging Face {kind} model: "
                              f"export writes only what transformers computes exactly")
        if given[path] != expected[path]:
            raise ConfigError(f"parameter {path} of {name} is {list(given[path])}, but {list(expected[path])} in a "
                              f"Hugging Face {kind} model of this config: export writes only what transformers "
                              f"computes exactly")


def _check_behaviour(model: GPT, params: Any, stock: GPT, kind: str) -> None:
    """The model and the stock GPT give the same logits from the same parameters (float32)."""
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, model.vocab_size, (PROBE[0], min(PROBE[1], model.seq_len))), jnp.int32)
    ours = jax.jit(model.clone(activation_dtype="float32").apply)({"params": params}, tokens)
    reference = jax.jit(stock.apply)({"params": _unrolled(model, params)}, tokens)
    difference = float(jnp.abs(ours - reference).max())
    if not difference <= TOLERANCE * max(1.0, float(jnp.abs(reference).max())):
        raise ConfigError(f"{type(model).__name__} computes other logits than theseus's GPT from the same "
                          f"parameters (by up to {difference:.3g} on a probe batch): a Hugging Face {kind} model "
                          f"would not compute what it does")


def _unrolled(model: GPT, params: Any) -> Any:
    return unstack_layers(params) if model.scan_layers else params


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    return {path: tuple(leaf.shape) for path, leaf in traverse_util.flatten_dict(tree, sep="/").items()}
