"""task=sft: the masked loss equals transformers' with -100 labels; packed conversations give
the per-token losses of the same conversations alone; loaders batch, drop and resume."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from data.chat_folders import CONVERSATIONS, chatml_folder

from theseus.config import ConfigError, configuration, configure
from theseus.data.chat import ChatTemplate, encode_chat
from theseus.data.conversations import Conversations, Windows, pack
from theseus.data.tokenizer import ByteTokenizer, HFTokenizer
from theseus.model.models.gpt import GPT, segment_positions
from theseus.tasks.sft import SupervisedFineTuning

TALK = [[{"role": "user", "content": f"Question {i}: {'why ' * (i % 5)}?"},
         {"role": "assistant", "content": f"Answer {i}" + "!" * (i % 7)}] for i in range(12)]


def tiny_gpt(positions: str, scan_layers: bool = False) -> GPT:
    with configuration({"architecture.n_layers": 2, "architecture.d_model": 32, "architecture.n_heads": 4,
                        "architecture.seq_len": 192, "architecture.positions": positions,
                        "architecture.scan_layers": scan_layers, "architecture.dtype.activation": "float32"}):
        return configure(GPT, vocab_size=257)


def token_losses(model, params, example: np.ndarray) -> np.ndarray:
    """Per-position nll of ``example [3, seq + 1]`` (segments through attention), 0 where unmasked."""
    tokens, mask, segments = (jnp.asarray(example[i][None]) for i in range(3))
    logits = model.apply({"params": params}, tokens[:, :-1], segments=segments[:, :-1])
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], axis=-1)[0, :, 0]
    return jnp.where(mask[0, 1:] > 0, nll, 0.0)


def test_segment_positions_restart_per_segment():
    segments = jnp.asarray([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1]])
    assert segment_positions(segments).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1], list(range(8))]


@pytest.mark.slow
@pytest.mark.parametrize("positions, scan_layers", [("learned", False), ("rope", True)])
def test_packed_losses_equal_unpacked(positions, scan_layers):
    template, tokenizer = ChatTemplate.find("byte"), ByteTokenizer()
    conversations = [encode_chat(template, tokenizer, m) for m in TALK]
    seq = 191
    packed = Windows(conversations, pack([len(ids) for ids, _ in conversations], seq + 1), seq, 1, 0)
    alone = Windows(conversations, [[i] for i in range(len(conversations))], seq, 1, 0)
    assert max(len(w) for w in packed.layout) >= 3  # several conversations share a window
    model = tiny_gpt(positions, scan_layers)
    params = model.init(jax.random.key(0), jnp.zeros((1, seq), jnp.int32))["params"]
    apply = jax.jit(lambda example: token_losses(model, params, example))
    for w, window in enumerate(packed.layout):
        losses = np.asarray(apply(packed.row(w)))
        at = 0
        for i in window:
            n = len(conversations[i][0])
            own = np.asarray(apply(alone.row(i)))[: n - 1]
            np.testing.assert_allclose(losses[at: at + n - 1], own, atol=1e-5)
            assert losses[at + n - 1: at + n].sum() == 0 or at + n - 1 == seq  # nothing across conversations
            at += n
    # without segments the second conversation of a window would see the first: the test can fail
    row = packed.row(0)
    unsegmented = row.copy()
    unsegmented[2] = 1
    assert not np.allclose(apply(row), apply(unsegmented), atol=1e-3)


@pytest.mark.slow
def test_masked_loss_equals_transformers(tmp_path):
    """The sft loss of a batch equals transformers' loss with labels -100 outside
    apply_chat_template's assistant_masks (padded and packed alike); a mask one token off does not."""
    from interop.hf_models import qwen2_config, save_hf, target_of, theseus_model, torch, transformers

    from theseus.interop.hf_config import arch_of
    from theseus.sources.weights import load_params

    config = qwen2_config()
    config.vocab_size, config.max_position_embeddings = 400, 256
    folder = save_hf(transformers.Qwen2ForCausalLM(config), tmp_path / "qwen", tokenizer=False)
    chatml_folder(folder)
    reference = transformers.AutoTokenizer.from_pretrained(folder)
    out = reference.apply_chat_template(CONVERSATIONS, return_dict=True, return_assistant_tokens_mask=True)
    width = max(map(len, out["input_ids"]))
    ids = np.zeros((len(CONVERSATIONS), width), np.int64)
    labels = np.full_like(ids, -100)
    attention = np.zeros_like(ids)
    for row, (tokens, mask) in enumerate(zip(out["input_ids"], out["assistant_masks"])):
        ids[row, :len(tokens)], attention[row, :len(tokens)] = tokens, 1
        labels[row, :len(tokens)] = np.where(np.asarray(mask) == 1, tokens, -100)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        expected = float(hf(torch.from_numpy(ids), attention_mask=torch.from_numpy(attention),
                            labels=torch.from_numpy(labels)).loss)

    model = theseus_model(folder)
    params = load_params(folder, arch_of(model), target_of(model))
    template = ChatTemplate.find(str(folder / "tokenizer.json"))
    tokenizer = HFTokenizer.from_file(folder / "tokenizer.json")
    conversations = [encode_chat(template, tokenizer, m) for m in CONVERSATIONS]
    seq = 255
    task = SupervisedFineTuning()
    loss = jax.jit(lambda batch: task.loss(model, params, batch, None))
    padded = Windows(conversations, [[0], [1]], seq, 2, 0)
    packed = Windows(conversations, [[0, 1]], seq, 1, 0)
    for windows in (padded, packed):
        batch = np.stack([windows.row(w) for w in range(windows.per_epoch)])
        assert abs(float(loss(batch)) - expected) < 1e-5
    late = np.stack([padded.row(w) for w in range(2)])
    late[:, 1] = np.roll(late[:, 1], 1, axis=-1)
    early = np.stack([padded.row(w) for w in range(2)])
    early[:, 1] = np.roll(early[:, 1], -1, axis=-1)
    assert abs(float(loss(late)) - expected) > 1e-3 and abs(float(loss(early)) - expected) > 1e-3  # 100x the tolerance


def rows(n: int = 40):
    return [{"messages": TALK[i % len(TALK)]} for i in range(n)]


def test_loader_batches_resume_and_drop(capsys):
    data = Conversations.encode(rows(), ChatTemplate.find("byte"), ByteTokenizer(), val_fraction=0.1, seed=0)
    assert data.n_conversations("val") == 4 and data.n_conversations("train") == 36
    loader = data.loader("train", seq_len=63, batch_size=4, seed=1, prefetch=0)
    first = [next(loader) for _ in range(3)]
    assert first[0].shape == (4, 3, 64) and first[0].dtype == np.int32
    state = loader.get_state()
    later = [next(loader) for _ in range(2)]
    again = data.loader("train", seq_len=63, batch_size=4, seed=1, prefetch=0)
    again.set_state(state)
    for batch in later:
        np.testing.assert_array_equal(next(again), batch)
    short = data.windows("train", seq_len=63, batch_size=1, seed=0)  # the loader's layout: counted once
    lengths = [len(ids) for ids, _ in data.splits["train"]]
    too_long = sum(n > 64 for n in lengths)
    assert too_long and capsys.readouterr().err == f"theseus: train: dropped {too_long} of 36 conversations " \
        f"({too_long} longer than seq_len + 1 = 64 tokens)\n"
    assert sorted(i for w in short.layout for i in w) == [i for i, n in enumerate(lengths) if n <= 64]  # none cut
    assert all(sum(lengths[i] for i in w) <= 64 for w in short.layout)
    with pytest.raises(ConfigError, match="none of the 36 train conversations fits"):
        data.windows("train", seq_len=10, batch_size=1, seed=0)
    unpacked = Conversations.encode(rows(), ChatTemplate.find("byte"), ByteTokenizer(), packing=False)
    assert all(len(w) == 1 for w in unpacked.windows("train", 63, 1, 0).layout)


def test_bad_rows_are_refused():
    template, tokenizer = ChatTemplate.find("byte"), ByteTokenizer()
    with pytest.raises(ConfigError, match="row 2 of the corpus has no field 'messages'.*set data.chat_field"):
        Conversations.encode([{"messages": TALK[0]}, {"text": "x"}], template, tokenizer)
    with pytest.raises(ConfigError, match="row 1 of the corpus, field 'chat', must be a non-empty list"):
        Conversations.encode([{"chat": "hello"}], template, tokenizer, chat_field="chat")


@pytest.mark.slow
def test_val_loss_is_the_masked_mean_over_the_validation_conversations():
    """evaluate's val_loss of task=sft: every validation conversation once, packed, equals the
    mean over all their masked targets, each conversation scored alone."""
    from jax.sharding import NamedSharding, PartitionSpec

    from theseus.evaluation.evaluations import EvaluationConfig, evaluate, load_evaluations

    data = Conversations.encode(rows(30), ChatTemplate.find("byte"), ByteTokenizer(), val_fraction=0.4, seed=3)
    model = tiny_gpt("rope")
    seq = 191
    params = model.init(jax.random.key(1), jnp.zeros((1, seq), jnp.int32))["params"]
    task = SupervisedFineTuning()
    evaluations = load_evaluations(EvaluationConfig(), data, model, seed=0, prefetch=0)
    mesh = jax.make_mesh((1,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    metrics = evaluate(params, evaluations, loss=jax.jit(lambda p, b: task.eval_loss_and_metrics(model, p, b)),
                       val_metrics=task.val_metrics, sharding=NamedSharding(mesh, PartitionSpec("data")), rules=(),
                       share=(0, 1), batch_size=2, batches=1)
    alone = Windows(data.splits["val"], [[i] for i in range(data.n_conversations("val"))], seq, 1, 0)
    losses = np.concatenate([np.asarray(token_losses(model, params, alone.row(i)))[alone.row(i)[1, 1:] > 0]
                             for i in range(alone.per_epoch)])
    assert data.n_conversations("val") == 12 and len(losses) > 100
    assert metrics["val_loss"] == pytest.approx(float(losses.mean()), abs=1e-5)


def test_a_task_reads_conversations_from_jsonl_and_parquet_alike(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from theseus.data.config import DataConfig

    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows(12)))
    pq.write_table(pa.Table.from_pylist(rows(12)), tmp_path / "chats.parquet")
    task = SupervisedFineTuning()
    found = [task.dataset(DataConfig(source=source, path=str(tmp_path / f"chats.{source}"), val_fraction=0.25,
                                     cache_dir=str(tmp_path / "cache"))) for source in ("jsonl", "parquet")]
    for split in ("train", "val"):
        assert found[0].rows[split] == found[1].rows[split] and len(found[0].rows[split]) == {"train": 9, "val": 3}[split]
        for (ids, mask), (other_ids, other_mask) in zip(found[0].splits[split], found[1].splits[split]):
            assert ids.tolist() == other_ids.tolist() and mask.tolist() == other_mask.tolist()
    with pytest.raises(ConfigError, match="task=sft reads one source of conversations: drop data.mixture"):
        task.dataset(DataConfig(mixture={"a": {"source": "jsonl", "path": str(tmp_path / "chats.jsonl"), "weight": 1}}))
