"""task=dpo against TRL 1.x: pairs tokenized as TRL's DPOTrainer tokenizes them; the numbers of
``theseus.evaluate`` (loss and TRL's metrics, every loss type, standard and conversational
pairs, a policy and a reference that differ) equal ``DPOTrainer(...).evaluate()``'s; the
reference's log-probs, computed once and read back from the cache, equal transformers' own; a
batch's split (grad_accum, devices) changes neither loss nor gradients; bad rows in one line."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from support import run_python
from tasks.dpo_folders import (conversational_rows, random_llama, standard_rows, transformers, transformers_logps,
                               write_rows)

from theseus.config import ConfigError
from theseus.data.config import DataConfig
from theseus.data.preferences import prepare_pairs
from theseus.tasks.dpo import DirectPreference, dpo_loss

datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """``policy/`` and ``reference/`` (Llamas that differ), ``standard.jsonl``, ``conversational.jsonl``."""
    base = tmp_path_factory.mktemp("dpo")
    random_llama(base / "policy", seed=0)
    random_llama(base / "reference", seed=1)
    write_rows(base / "standard.jsonl", standard_rows())
    write_rows(base / "conversational.jsonl", conversational_rows())
    return base


def trl_args(**kwargs):
    return trl.DPOConfig(output_dir="unused", bf16=False, use_cpu=True, report_to=[], max_length=None, **kwargs)


def trl_tokenized(folder: Path, rows: list[dict]) -> list[tuple[list, list, list]]:
    """TRL's own tokenization of ``rows`` (``DPOTrainer._prepare_dataset``, run as the trainer runs it)."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    trainer = types.SimpleNamespace(_tokenizer=tokenizer)
    prepared = trl.DPOTrainer._prepare_dataset(trainer, datasets.Dataset.from_list(rows), tokenizer, trl_args(), "x")
    return [(row["prompt_ids"], row["chosen_ids"], row["rejected_ids"]) for row in prepared]


@pytest.mark.parametrize("kind", ["standard", "conversational"])
def test_pairs_are_tokenized_as_trl_tokenizes_them(project, kind, tmp_path):
    data = DataConfig(source="jsonl", path=str(project / f"{kind}.jsonl"),
                      tokenizer=str(project / "policy" / "tokenizer.json"), cache_dir=str(tmp_path))
    ours = [tuple(part.tolist() for part in pair) for pair in prepare_pairs(data).pairs]
    expected = trl_tokenized(project / "policy", [json.loads(line) for line in open(data.path)])
    assert ours == expected
    if kind == "standard":  # the BOS, an eos appended once, and a prompt whose last token merges into the completion
        assert all(prompt[0] == 3 and chosen[-1] == rejected[-1] == 2 for prompt, chosen, rejected in ours)
        assert ours[1][1][-2] != 2
        assert len(ours[-2][0]) < len(transformers.AutoTokenizer.from_pretrained(project / "policy")("Say yes ").input_ids)


# loss type, beta, label smoothing: each a beta of its own, smoothing where the loss reads it
CASES = [("sigmoid", 0.1, 0.2), ("ipo", 0.5, 0.0), ("hinge", 0.3, 0.0), ("robust", 0.2, 0.1),
         ("sigmoid_norm", 0.7, 0.0), ("exo_pair", 0.1, 1e-3)]


def trl_numbers(project: Path, kind: str, loss_type: str, beta: float, smoothing: float) -> dict[str, float]:
    """``DPOTrainer(policy, ref_model=reference).evaluate()`` on every pair of ``kind``, one batch."""
    rows = datasets.Dataset.from_list([json.loads(line) for line in open(project / f"{kind}.jsonl")])
    load = transformers.AutoModelForCausalLM.from_pretrained
    trainer = trl.DPOTrainer(load(project / "policy"), ref_model=load(project / "reference"),
                             args=trl_args(per_device_eval_batch_size=len(rows), beta=beta, loss_type=loss_type,
                                           label_smoothing=smoothing),
                             train_dataset=rows, eval_dataset=rows,
                             processing_class=transformers.AutoTokenizer.from_pretrained(project / "policy"))
    return trainer.evaluate()


def theseus_numbers(project: Path, kind: str, *overrides: str) -> dict[str, float]:
    """What ``python -m theseus.evaluate policy task=dpo ...`` records, run in this process."""
    from theseus.cli.evaluate import run_evaluations
    from theseus.sources.parse import parse_source

    record = run_evaluations(parse_source(project / "policy", key=None), None, ["task=dpo", "data.source=jsonl",
                                                         f"data.path={project / f'{kind}.jsonl'}",
                                                         f"dpo.reference={project / 'reference'}",
                                                         f"data.cache_dir={project / 'cache'}", "trainer.batch_size=4",
                                                         *overrides])
    return record["metrics"]


@pytest.mark.slow
@pytest.mark.parametrize("loss_type, beta, smoothing", CASES)
def test_evaluate_gives_trls_numbers(project, loss_type, beta, smoothing):
    for kind in ("standard", "conversational"):
        expected = trl_numbers(project, kind, loss_type, beta, smoothing)
        ours = theseus_numbers(project, kind, f"dpo.loss_type={loss_type}", f"dpo.beta={beta}",
                               f"dpo.label_smoothing={smoothing}")
        names = ["loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen",
                 "logps/rejected"]
        # a reward is beta x the difference of two float32 log-probs near |logps| (~65 here): it is
        # as exact as a few of their float32 ulps (7.6e-6 each), whatever its own size
        ulp = float(np.spacing(np.float32(max(abs(expected["eval_logps/chosen"]), abs(expected["eval_logps/rejected"])))))
        for name in names:
            exact = 4 * beta * ulp if name.startswith("rewards/") and name != "rewards/accuracies" else 1e-6
            assert ours[f"val_{name}"] == pytest.approx(expected[f"eval_{name}"], rel=1e-4, abs=exact), (kind, name)
        assert abs(ours["val_rewards/margins"]) > 1e-3 and 0 < ours["val_rewards/accuracies"] < 1  # not a trivial pair


@pytest.mark.slow
def test_the_reference_is_scored_once_into_the_cache_as_transformers_scores_it(project, capfd):
    cache = project / "cache"
    theseus_numbers(project, "standard", "dpo.beta=0.3")  # scored here, or by an earlier test: kept
    capfd.readouterr()
    folders = sorted(cache.glob("reference-*"))
    swept = [theseus_numbers(project, "standard", f"dpo.beta={beta}", "dpo.loss_type=hinge") for beta in (0.1, 0.2)]
    assert "reference's log-probs" not in capfd.readouterr().err  # a sweep over beta or the loss reads them back
    assert sorted(cache.glob("reference-*")) == folders
    assert swept[0]["val_logps/chosen"] == swept[1]["val_logps/chosen"]
    assert swept[1]["val_rewards/margins"] == pytest.approx(2 * swept[0]["val_rewards/margins"], rel=1e-5)
    free = theseus_numbers(project, "standard", "dpo.beta=0.2", "dpo.reference=none")  # reference-free: log-probs 0
    assert free["val_rewards/chosen"] == pytest.approx(0.2 * free["val_logps/chosen"], rel=1e-5)
    assert sorted(cache.glob("reference-*")) == folders

    data = DataConfig(source="jsonl", path=str(project / "standard.jsonl"),
                      tokenizer=str(project / "policy" / "tokenizer.json"), cache_dir=str(cache))
    pairs = prepare_pairs(data).pairs
    [kept] = [np.load(folder / "logps.npy") for folder in folders
              if json.loads((folder / "meta.json").read_text())["pairs"].startswith("pairs-jsonl-json")
              and np.isfinite(np.load(folder / "logps.npy")).all()
              and np.allclose(np.load(folder / "logps.npy"), transformers_logps(project / "reference", pairs),
                              rtol=1e-4)]
    assert kept.shape == (len(pairs), 2)


def test_parquet_rows_are_jsonl_rows_and_pairs_too_long_are_dropped_or_refused(project, tmp_path, capfd):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in open(project / "conversational.jsonl")]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pairs.parquet")
    tokenizer = str(project / "policy" / "tokenizer.json")
    read = {source: prepare_pairs(DataConfig(source=source, path=str(path), tokenizer=tokenizer,
                                             cache_dir=str(tmp_path / "cache")))
            for source, path in (("jsonl", project / "conversational.jsonl"), ("parquet", tmp_path / "pairs.parquet"))}
    pairs = read["jsonl"].pairs
    assert [[part.tolist() for part in pair] for pair in read["parquet"].pairs] == [[p.tolist() for p in pair]
                                                                                    for pair in pairs]
    needs = sorted(len(prompt) + max(len(chosen), len(rejected)) - 1 for prompt, chosen, rejected in pairs)
    kept = read["jsonl"].fitting("train", needs[len(needs) // 2])
    assert 0 < len(kept) < read["jsonl"].n_pairs("train")
    assert capfd.readouterr().err == ""  # checked: counted where the split is read, once
    for _ in range(2):
        assert read["jsonl"].fitting("train", needs[len(needs) // 2], say=True) == kept
    said = capfd.readouterr().err
    assert said.startswith(f"theseus: train: dropped {read['jsonl'].n_pairs('train') - len(kept)} of ")
    assert said.count("\n") == 1
    with pytest.raises(ConfigError, match=rf"raise architecture.seq_len to {needs[0]} for the shortest, {needs[-1]}"):
        read["jsonl"].fitting("all", needs[0] - 1)


def test_losses_at_the_reference_and_their_settings(tmp_path):
    same = jnp.asarray([-3.0, -5.0])
    for loss_type, expected in (("sigmoid", math.log(2)), ("hinge", 1.0), ("sigmoid_norm", math.log(2))):
        losses, metrics = dpo_loss(same, same, same, same, jnp.ones(2), jnp.ones(2), beta=0.1, loss_type=loss_type)
        assert np.allclose(losses, expected) and not metrics["rewards/accuracies"].any()  # strictly greater: none
        assert not metrics["rewards/margins"].any()
    with pytest.raises(ConfigError, match="exo_pair needs dpo.label_smoothing > 0"):
        DirectPreference(loss_type="exo_pair")
    with pytest.raises(ConfigError, match=r"dpo.label_smoothing must be in \[0, 0.5\)"):
        DirectPreference(loss_type="robust", label_smoothing=0.5)
    with pytest.raises(ConfigError, match="dpo.reference=.*nowhere does not exist: give a Hugging Face folder"):
        DirectPreference(reference_given=str(tmp_path / "nowhere"))


@pytest.mark.parametrize("key, value, message", [
    ("dpo.beta", 0.0, r"dpo.beta must be positive, got 0.0: e.g. dpo.beta=0.1"),
    ("dpo.beta", -1.0, r"dpo.beta must be positive, got -1.0"),
    ("dpo.label_smoothing", 0.5, r"dpo.label_smoothing must be in \[0, 0.5\), got 0.5"),
    ("dpo.label_smoothing", -0.1, r"dpo.label_smoothing must be in \[0, 0.5\), got -0.1"),
    ("dpo.loss_type", "kto", r"dpo.loss_type must be one of sigmoid, ipo, hinge, robust, sigmoid_norm, exo_pair, got "
                             r"'kto'"),
])
def test_every_key_at_its_bounds_is_one_line(key, value, message):
    from theseus.config import configuration, configure

    with configuration({key: value}), pytest.raises(ConfigError, match=f"^{message}"):
        configure(DirectPreference)
    configure(DirectPreference, beta=1e-9, label_smoothing=0.4999, loss_type="robust")  # just inside


def test_a_reference_of_another_architecture_is_refused_before_the_pairs_are_read(project, tmp_path):
    """Its config against the policy's (before: its weights, after compiling: a traceback for a
    theseus run's); another's weights of the same architecture pass; a checkpoint's shapes are
    checked before its weights are read (its vocabulary: the one key its config may not settle)."""
    from omegaconf import OmegaConf

    from theseus.config.compose import compose, with_values
    from theseus.sources.in_config import check_same_architecture, init_from_values, init_source
    from theseus.sources.parse import parse_source
    from theseus.sources.theseus_run import differing_param

    cfg = compose(["task=dpo", f"trainer.init_from={project / 'policy'}"])
    cfg = with_values(cfg, init_from_values(cfg, init_source(cfg)))
    check_same_architecture(cfg, parse_source(project / "reference", "dpo.reference"))
    run = tmp_path / "run"  # a theseus run of gpt_tiny: its saved config says what it computes
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(compose(["+experiment=gpt_tiny"]), run / ".hydra" / "config.yaml")
    (run / "checkpoints" / "1").mkdir(parents=True)
    with pytest.raises(ConfigError) as err:
        check_same_architecture(cfg, parse_source(run, "dpo.reference"))
    assert str(err.value) == (f"dpo.reference={run}: its architecture differs from the policy's "
                              f"(architecture.activation: gelu there, swiglu here; architecture.bias: True there, "
                              f"False here; architecture.d_ff: 256 there, 96 here; 5 more): give a reference of the "
                              f"policy's architecture and vocabulary (the model it starts from, or a checkpoint of its "
                              f"run), or dpo.reference=none")
    policy = {"wte/embedding": (400, 64), "h_0/attn/wq": (64, 4, 16)}
    assert differing_param({**policy, "extra": (1,)}, policy) is None
    assert differing_param({**policy, "wte/embedding": (257, 64)}, policy) == \
        ("wte/embedding", (400, 64), "is (257, 64) there")
    assert differing_param({"wte/embedding": (400, 64)}, policy) == ("h_0/attn/wq", (64, 4, 16), "does not exist there")


@pytest.mark.parametrize("rows, message", [
    ([{"prompt": "a", "chosen": "b"}], r"pairs.jsonl line 1 has no field 'rejected' \(it has 'prompt', 'chosen'\)"),
    ([{"prompt": "a", "chosen": "b", "rejected": "c"}, {"prompt": "a", "chosen": ["b"], "rejected": "c"}],
     r"pairs.jsonl line 2: chosen must be a string, as its prompt is, got \['b'\]"),
    ([{"prompt": "a", "chosen": "b", "rejected": "b"}] * 3, "pairs.jsonl has its chosen completion equal to its rejected"),
    ([{"prompt": [{"role": "user", "content": "a"}], "chosen": [{"role": "robot", "content": "b"}],
       "rejected": [{"role": "assistant", "content": "c"}]}], r"pairs.jsonl line 1: chosen holds .*each message needs"),
])
def test_bad_rows_are_refused_naming_file_and_line(tmp_path, rows, message):
    data = DataConfig(source="jsonl", path=str(write_rows(tmp_path / "pairs.jsonl", rows)), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=message):
        prepare_pairs(data)
    assert not (tmp_path / "cache").exists()  # nothing written


SPLITS = r"""
import json, functools
import flax.linen as nn, jax, jax.numpy as jnp, numpy as np, optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from theseus.config import configuration, configure
from theseus.model.models.gpt import GPT
from theseus.tasks.dpo import DirectPreference
from theseus.training.batches import batch_sharding
from theseus.training.state import init_state
from theseus.training.step import train_step

with configuration({"architecture.n_layers": 2, "architecture.d_model": 32, "architecture.n_heads": 4,
                    "architecture.seq_len": 24, "architecture.dtype.activation": "float32"}):
    model = configure(GPT, vocab_size=97)
task, tx = DirectPreference(loss_type="ipo", beta=0.3), optax.sgd(1.0)
state = nn.unbox(init_state(model, tx, seq_len=24, seed=0))
rng = np.random.default_rng(0)
tokens = rng.integers(0, 97, (8, 2, 25)).astype(np.int32)
starts, ends = rng.integers(3, 10, (8, 1, 1)), rng.integers(12, 26, (8, 2, 1))
position = np.arange(25)[None, None]
batch = {"tokens": tokens, "completion": ((position >= starts) & (position < ends)).astype(np.int32),
         "reference": rng.normal(-40, 5, (8, 2)).astype(np.float32)}
results = {}
for devices, accum in ((1, 1), (1, 2), (2, 1)):
    mesh = Mesh(np.asarray(jax.devices()[:devices]).reshape(devices, 1, 1), ("data", "fsdp", "expert"))
    split = jax.tree.map(lambda x: jax.device_put(x.reshape(accum, -1, *x.shape[1:]),
                                                  batch_sharding(mesh, accumulated=True)), batch)
    step = jax.jit(functools.partial(train_step, model=model, task=task, tx=tx, schedule=lambda s: 1.0))
    new, metrics = step(jax.device_put(state, NamedSharding(mesh, PartitionSpec())), split, jax.random.key(0))
    grads = [np.asarray(old - new).ravel() for old, new in zip(jax.tree.leaves(state.params), jax.tree.leaves(new.params))]
    results[f"{devices}x{accum}"] = {"metrics": {k: float(v) for k, v in metrics.items()},
                                     "grads": np.concatenate(grads).tolist()}
print("RESULTS" + json.dumps(results))
"""


@pytest.mark.slow
def test_a_batch_split_by_accumulation_or_devices_gives_the_same_loss_and_gradients():
    proc = run_python("-c", SPLITS, devices=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("RESULTS", 1)[1])
    whole = results.pop("1x1")
    assert np.linalg.norm(whole["grads"]) > 1e-3
    for name, split in results.items():
        for key in ("loss", "rewards/margins", "rewards/accuracies", "logps/chosen", "grad_norm"):
            assert split["metrics"][key] == pytest.approx(whole["metrics"][key], rel=1e-5, abs=1e-7), (name, key)
        np.testing.assert_allclose(split["grads"], whole["grads"], rtol=1e-4, atol=1e-7, err_msg=name)
