"""Multiple-choice scoring: one batched, masked forward equals one forward per choice; bad files are one line."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from theseus.base.mesh import MeshConfig, make_mesh
from theseus.config import ConfigError, configuration, configure
from theseus.data.tokenizer import ByteTokenizer
from theseus.evaluation.multiple_choice import accuracy, load_examples, log_likelihoods, score
from theseus.model.models.gpt import GPT

from support import run_python

SEQ = 24
TINY = {"architecture.vocab_size": 257, "architecture.seq_len": SEQ, "architecture.n_layers": 2,
        "architecture.d_model": 32, "architecture.n_heads": 4}
EXAMPLES = [  # uneven choice counts and lengths; the last context is longer than SEQ (truncated on the left)
    {"context": "The cat sat on the", "choices": [" mat", " moon", " hat"], "label": 0},
    {"context": "1 2 3", "choices": [" 4", " five and six"], "label": 1},
    {"context": "é", "choices": ["t\u00e9", " été", "x", "yy"], "label": 3},
    {"context": "a long context that will not fit in the window " * 2, "choices": [" end", " stop"], "label": 0},
    {"context": "def f(x):", "choices": [" return x", " pass"], "label": 0},
]


def write(path: Path, records) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


@pytest.fixture(scope="module")
def model_and_params():
    with configuration(TINY):
        model = configure(GPT)
    shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, SEQ), jnp.int32))["params"]
    rng = np.random.default_rng(0)  # random weights without compiling an init (slow on a busy CPU)
    params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.3, s.shape), s.dtype), shapes)
    return model, params


def reference(model, params, record) -> list[float]:
    """One forward per choice (its text alone, as one sequence; the causal model does not see
    the zeros after it): the choice tokens' summed log-probabilities, added up in Python. The
    context's trailing whitespace is scored with the choice (bytes split anywhere alike)."""
    tokenizer, out = ByteTokenizer(), []
    forward = jax.jit(lambda x: jax.nn.log_softmax(model.apply({"params": params}, x).astype(jnp.float32)))
    context = record["context"].rstrip()
    for choice in record["choices"]:
        ids = tokenizer.encode(record["context"][len(context):] + choice)
        row = (tokenizer.encode(context) + ids)[-(SEQ + 1):]
        logp = np.asarray(forward(jnp.array([row[:-1] + [0] * (SEQ + 1 - len(row))]))[0])
        out.append(sum(float(logp[t - 1, row[t]]) for t in range(len(row) - len(ids), len(row))))
    return out


@pytest.mark.slow
def test_batched_scores_equal_one_forward_per_choice(model_and_params, tmp_path):
    model, params = model_and_params
    examples = load_examples(write(tmp_path / "mc.jsonl", EXAMPLES), ByteTokenizer(), SEQ)
    assert examples.tokens.shape == (5, 4, SEQ + 1) and examples.valid.sum() == 13
    mesh = make_mesh(MeshConfig(data=1), jax.devices()[:1])
    sharding = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None, None))
    fn = jax.jit(functools.partial(log_likelihoods, model=model))
    with jax.set_mesh(mesh):
        scores = score(params, examples, fn, sharding, batch_size=2)  # 3 calls, the last padded
    assert scores.shape == (5, 4)
    for i, record in enumerate(EXAMPLES):
        expected = reference(model, params, record)
        np.testing.assert_allclose(scores[i, :len(expected)], expected, rtol=1e-5, atol=1e-4)


SHARDED = r"""
import functools, json, sys
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec
from theseus.base.mesh import MeshConfig, make_mesh
from theseus.config import configuration, configure
from theseus.data.tokenizer import ByteTokenizer
from theseus.model.models.gpt import GPT
from theseus.evaluation.multiple_choice import load_examples, log_likelihoods, score

tiny, seq, path = json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
with configuration(tiny):
    model = configure(GPT)
shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, seq), jnp.int32))["params"]
rng = np.random.default_rng(0)
params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.3, s.shape), s.dtype), shapes)
examples = load_examples(path, ByteTokenizer(), seq)
fn = jax.jit(functools.partial(log_likelihoods, model=model))
out = {}
meshes = {"one": make_mesh(MeshConfig(data=1), jax.devices()[:1]), "four": make_mesh(MeshConfig(data=4))}
for name, mesh in meshes.items():
    sharding = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None, None))
    with jax.set_mesh(mesh):
        out[name] = score(jax.device_put(params, NamedSharding(mesh, PartitionSpec())), examples, fn, sharding,
                          batch_size=4).tolist()
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
def test_scores_sharded_over_four_devices_equal_one_device(tmp_path):
    path = write(tmp_path / "mc.jsonl", EXAMPLES)
    proc = run_python("-c", SHARDED, json.dumps(TINY), str(SEQ), str(path), devices=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))[len("RESULT"):])
    np.testing.assert_allclose(result["four"], result["one"], rtol=1e-5, atol=1e-5)


def test_accuracy_sums_or_normalises_by_characters_or_bytes(tmp_path):
    records = [{"context": "q", "choices": ["a", "bbbb"], "label": 1},
               {"context": "q", "choices": ["a", "bb"], "label": 0},
               {"context": "q", "choices": ["é", "ab"], "label": 0}]
    examples = load_examples(write(tmp_path / "mc.jsonl", records), ByteTokenizer(), SEQ)
    # summed: 0 picks "a" (-1 > -2), wrong; 1 picks "a" (-1 > -3), right; 2 picks "ab" (-1.5 > -1.6), wrong.
    # per character: 0 picks "bbbb" (-0.5 > -1), right; 1 "a" (-1 > -1.5), right; 2 "ab" (-0.75 > -1.6), wrong.
    # per byte ("é" is 2): 0 and 1 as per character; 2 picks "ab" (-0.75 > -0.8), wrong.
    scores = np.array([[-1.0, -2.0], [-1.0, -3.0], [-1.6, -1.5]])
    assert {k: v for k, v in accuracy(scores, examples).items() if not k.endswith("stderr")} == \
        {"acc": 1 / 3, "acc_norm": 2 / 3, "acc_bytes": 2 / 3}
    scores[2] = [-1.4, -1.5]  # "é" wins summed (-1.4 > -1.5) and per byte (-0.7 > -0.75), not per character
    metrics = accuracy(scores, examples)
    assert (metrics["acc"], metrics["acc_norm"], metrics["acc_bytes"]) == (2 / 3, 2 / 3, 1.0)
    hits = np.array([1.0, 1.0, 0.0])  # acc: the sample standard deviation over sqrt(n), lm-eval's mean_stderr
    assert metrics["acc_stderr"] == pytest.approx(np.sqrt(np.sum((hits - 2 / 3) ** 2) / 2) / np.sqrt(3))
    assert metrics["acc_bytes_stderr"] == 0.0


@pytest.mark.parametrize("line, message", [
    ('{"context": "x", "choices": [], "label": 0}', "choices must be a non-empty list of non-empty strings, got []"),
    ('{"context": "x", "choices": ["a", "b"], "label": 2}',
     "label must be the index of the right choice, 0 to 1, got 2"),
    ('{"context": "x", "choices": ["a", "b"], "label": -1}', "label must be the index of the right choice"),
    ('{"context": "x", "choices": ["a", "b"], "label": "a"}', "got 'a'"),
    ('{"context": "", "choices": ["a"], "label": 0}', "context must be a non-empty string"),
    ('{"context": "x", "choices": ["a", ""], "label": 0}', "choices must be a non-empty list of non-empty strings"),
    ('{"context": "x", "choices": ["a"]}', "not an example; each line must be a JSON object"),
    ('{"context": "x", "choices": ["a"], label: 0}', "not an example; each line must be a JSON object"),
])
def test_a_bad_line_is_one_line_naming_file_and_line(tmp_path, line, message):
    path = write(tmp_path / "bad.jsonl", [EXAMPLES[0], line])
    with pytest.raises(ConfigError) as err:
        load_examples(path, ByteTokenizer(), SEQ)
    assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value) and "\n" not in str(err.value)


def test_an_empty_or_missing_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="holds no examples"):
        load_examples(write(tmp_path / "empty.jsonl", [""]), ByteTokenizer(), SEQ)
    with pytest.raises(ConfigError, match="cannot read the multiple-choice file"):
        load_examples(tmp_path / "missing.jsonl", ByteTokenizer(), SEQ)


def test_a_choice_longer_than_the_window_is_cut_on_the_left_not_refused(tmp_path):
    long = "z" * 30  # SEQ is 24: the row keeps its last SEQ + 1 bytes, all of them the choice's
    examples = load_examples(write(tmp_path / "mc.jsonl", [{"context": "q", "choices": [long, "a"], "label": 0}]),
                             ByteTokenizer(), SEQ)
    assert examples.tokens[0, 0].tolist() == list(long.encode())[-(SEQ + 1):]
    assert examples.mask[0, 0].sum() == SEQ and examples.mask[0, 1].sum() == 1
    assert (examples.n_chars[0].tolist(), examples.n_bytes[0].tolist()) == ([30, 1], [30, 1])


def test_trailing_whitespace_is_scored_with_the_choice(tmp_path):
    """lm-eval's convention: "on the " + "mat" is scored as "on the" + " mat" (the same bytes, one
    more of them scored)."""
    examples = load_examples(write(tmp_path / "mc.jsonl", [{"context": "on the \n", "choices": ["mat"], "label": 0}]),
                             ByteTokenizer(), SEQ)
    row = list(b"on the \nmat")
    assert examples.tokens[0, 0, :len(row)].tolist() == row
    assert examples.mask[0, 0].tolist().index(1) == len("on the") - 1 and examples.mask[0, 0].sum() == 5
