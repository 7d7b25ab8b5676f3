"""lm-eval-harness on theseus models gives lm-eval's own numbers: the adapter, and theseus's own
multiple-choice scorer, against lm-eval's ``hf`` model on the same weights (GPT-2 and Llama
layouts, with and without a BOS), on local tasks whose contexts end in whitespace or mid-word."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from evaluation.harness_fixtures import MC, write_tasks
from jax.sharding import NamedSharding, PartitionSpec

from theseus.base.mesh import MeshConfig, make_mesh
from theseus.config import configuration, configure
from theseus.data.tokenizer import ByteTokenizer, HFTokenizer, export_tokenizer
from theseus.evaluation.multiple_choice import accuracy, load_examples, log_likelihoods, score
from theseus.interop.hf_config import arch_of
from theseus.model.generate import generate
from theseus.model.models.gpt import GPT
from theseus.sources.weights import load_params

lm_eval = pytest.importorskip("lm_eval")
pytest.importorskip("accelerate")  # lm-eval's hf model needs it
from interop.hf_models import (CORPUS, gpt2_config, llama_config, save_hf, target_of,  # noqa: E402
                               theseus_model, transformers)

from theseus.evaluation.harness import HarnessLM, run_tasks, task_manager  # noqa: E402

TASKS = ["theseus_mc", "theseus_ppl", "theseus_gen", "theseus_ll"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(key, "1")


def bpe(bos: bool) -> HFTokenizer:
    """A BPE tokenizer of the local corpus; ``bos``: Llama's way, a template adding <s> to every text."""
    from tokenizers import processors

    tokenizer = HFTokenizer.train([CORPUS.read_text()], vocab_size=300)
    if not bos:
        return tokenizer
    hf = tokenizer.as_hf()
    hf.add_special_tokens(["<s>"])
    hf.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", hf.token_to_id("<s>"))])
    return HFTokenizer(hf, "json")


def folder_of(kind: str, bos: bool, root: Path) -> tuple[Path, HFTokenizer]:
    model = (transformers.GPT2LMHeadModel(gpt2_config()) if kind == "gpt2"
             else transformers.LlamaForCausalLM(llama_config()))
    folder = save_hf(model, root / f"{kind}-{bos}", tokenizer=False)
    tokenizer = bpe(bos)
    export_tokenizer(tokenizer, folder)
    return folder, tokenizer


def reference(folder: Path, tasks: Path) -> dict:
    """lm-eval's own evaluation with its hf model (float32, CPU) of ``folder``, without its logits
    cache: lm-eval 0.4.13 scores a request whose tokens are another's, split later, on that one's
    first positions (the long multiple-choice example and the long log-likelihood one)."""
    return lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(folder), "dtype": "float32",
                                                           "device": "cpu", "logits_cache": False},
                                   tasks=TASKS, task_manager=lm_eval.tasks.TaskManager(include_path=str(tasks)),
                                   batch_size=4, log_samples=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind, bos", [("gpt2", False), ("gpt2", True), ("llama", True), ("llama", False)])
def test_the_adapter_and_the_multiple_choice_scorer_give_lm_evals_numbers(tmp_path, kind, bos):
    folder, tokenizer = folder_of(kind, bos, tmp_path)
    tasks = write_tasks(tmp_path / "tasks")
    expected = reference(folder, tasks)
    assert (tokenizer.prefix_token == tokenizer.as_hf().token_to_id("<s>")) == bos

    model = theseus_model(folder)
    params = load_params(folder, arch_of(model), target_of(model))
    mesh = make_mesh(MeshConfig(data=1), jax.devices()[:1])
    metrics, samples, _ = run_tasks(HarnessLM(model, params, tokenizer, mesh, (), batch_size=4), TASKS,
                                 task_manager(TASKS, str(tasks)))
    for task in TASKS:
        ours, theirs = samples[task], expected["samples"][task]
        assert [s["index"] for s in ours] == [s["doc_id"] for s in theirs]
        for a, b in zip(ours, theirs):
            if task == "theseus_gen":  # greedy generations, cut at the stop sequences: the same text
                assert a["responses"] == b["filtered_resps"]
                continue
            logp = [r[0] if isinstance(r, (list, tuple)) else r for r in a["responses"]]
            ref = [r[0] if isinstance(r, (list, tuple)) else r for r in b["filtered_resps"]]
            # rtol: a rolling document sums ~1000 nats, of which float32 keeps about 7 digits
            np.testing.assert_allclose(logp, ref, atol=1e-4, rtol=1e-6)
        for key, value in expected["results"][task].items():
            metric, _, kept = key.partition(",")
            if kept == "none" and isinstance(value, float):
                assert metrics[f"eval/{task}/{metric}"] == pytest.approx(value, rel=1e-5), (task, metric)

    # theseus's own multiple-choice scorer (what runs at the trainer's evaluations) on the same examples
    path = tmp_path / "tasks" / "mc.jsonl"
    examples = load_examples(path, tokenizer, model.seq_len)
    sharding = NamedSharding(mesh, PartitionSpec(("data", "fsdp"), None, None))
    with jax.set_mesh(mesh):
        scores = score(params, examples, jax.jit(lambda p, t, m: log_likelihoods(p, t, m, model=model)), sharding,
                       batch_size=4)
    per_choice = [[r[0] for r in s["filtered_resps"]] for s in expected["samples"]["theseus_mc"]]
    np.testing.assert_allclose(scores[examples.valid], np.concatenate(per_choice), atol=1e-4, rtol=0)
    ours = accuracy(scores, examples)
    for metric in ("acc", "acc_norm", "acc_bytes"):
        assert ours[metric] == expected["results"]["theseus_mc"][f"{metric},none"]
        assert ours[f"{metric}_stderr"] == pytest.approx(expected["results"]["theseus_mc"][f"{metric}_stderr,none"])
    assert len(MC) == len(examples)


class Request:
    """What lm-eval hands a model: an Instance's ``args``."""

    def __init__(self, *args):
        self.args = args


@pytest.mark.slow
def test_generate_until_stops_at_the_first_stop_sequence_and_samples_by_seed():
    """Greedy: theseus's own greedy continuation, cut before the earliest stop sequence; the
    context keeps its last tokens to leave room for max_gen_toks; sampled: seeded per request."""
    tiny = {"architecture.vocab_size": 257, "architecture.seq_len": 24, "architecture.n_layers": 2,
            "architecture.d_model": 32, "architecture.n_heads": 4}
    with configuration(tiny):
        model = configure(GPT)
    shapes = jax.eval_shape(model.init, jax.random.key(0), jnp.zeros((1, model.seq_len), jnp.int32))["params"]
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.3, s.shape), s.dtype), shapes)
    tokenizer = ByteTokenizer()
    lm = HarnessLM(model, params, tokenizer, make_mesh(MeshConfig(data=1), jax.devices()[:1]), (), batch_size=2,
                   vocab_size=tokenizer.vocab_size)
    context = "a context longer than the whole window of the model"  # 51 bytes, seq_len 24
    new = 10
    prompt = tokenizer.encode(context)[-(model.seq_len - new):]
    ids = generate(model, params, jnp.asarray([prompt]), new, temperature=0.0, vocab_size=tokenizer.vocab_size)
    full = tokenizer.decode(np.asarray(ids[0, len(prompt):]).tolist())
    stops = sorted(set(full[1:-1]), key=full.index)[:2]  # two characters it does produce, the earlier first
    [plain, cut] = lm.generate_until([Request(context, {"until": ["\x00never"], "max_gen_toks": new}),
                                      Request(context, {"until": stops[::-1], "max_gen_toks": new})])
    assert plain == full.split(tokenizer.decode([tokenizer.eot]))[0]
    assert cut == full[:full.index(stops[0])]
    sampled = [Request(context, {"until": [], "max_gen_toks": new, "do_sample": True, "temperature": 1.0})] * 3
    first, again = lm.generate_until(sampled), lm.generate_until(sampled)
    assert first == again and len(set(first)) > 1  # seeded: reproducible, and each request draws its own
    mixed = [Request(context[:n], {"until": stops[k % 2:], "max_gen_toks": 4 + k % 2 * 3,
                                   "do_sample": k % 3 == 0, "temperature": 0.8}) for k, n in enumerate((51, 5, 30, 12, 40))]
    one = HarnessLM(model, params, tokenizer, lm.mesh, (), batch_size=1, vocab_size=tokenizer.vocab_size)
    assert lm.generate_until(mixed) == one.generate_until(mixed)  # batched, sorted, regrouped: as one by one
    [window] = lm.generate_until([Request(context, {"until": [], "max_gen_toks": model.seq_len - 1})])
    [longer] = lm.generate_until([Request(context, {"until": [], "max_gen_toks": 3 * model.seq_len})])
    assert longer.startswith(window) and len(longer) > 2 * len(window)  # 72 tokens: past the window of 24


def test_a_task_yaml_that_does_not_load_is_named_where_its_task_is_unknown(tmp_path):
    """lm-eval's index skips a task YAML that does not parse without a word (its task then reads as
    unknown): the file is named, its own task's first; a ``!function`` tag loads as lm-eval's does."""
    from theseus.evaluation.harness import unreadable_task_file

    write_tasks(tmp_path)
    (tmp_path / "uses_a_function.yaml").write_text("task: f\nprocess_docs: !function utils.process\n")
    assert unreadable_task_file(str(tmp_path), "my_task") is None
    (tmp_path / "a_list.yaml").write_text("- task: listed\n")
    (tmp_path / "my_task.yaml").write_text("task: my_task\ndataset_path: [\n")
    assert unreadable_task_file(str(tmp_path), "my_task") == (
        f"{tmp_path}/my_task.yaml does not parse as YAML (line 3: expected the node content, but found '<stream end>')")
    assert unreadable_task_file(str(tmp_path), "other") == (
        f"{tmp_path}/a_list.yaml holds list, not a task's mapping (task: NAME, dataset_path: ...)")
