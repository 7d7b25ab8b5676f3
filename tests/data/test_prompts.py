"""task=grpo's prompt rows: tokenized as TRL's GRPOTrainer tokenizes them (``_tokenize_prompts``,
standard prompts with the BOS a tokenizer adds, conversations by the chat template with the
generation prompt), split, drawn a step's prompts at a time; bad rows in one line."""

from __future__ import annotations

import json
import types

import numpy as np
import pytest
from data.chat_folders import chatml_bos_folder, llama3_folder

from theseus.config import ConfigError
from theseus.data.config import DataConfig
from theseus.data.prompts import Prompts
from theseus.data.tokenizer import EOT

transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl")

STANDARD = [{"prompt": f"Q{i}: what is {i} and {i + 1}?", "answer": str(2 * i + 1), "id": i} for i in range(10)]
CONVERSATIONAL = [{"prompt": [{"role": "user", "content": row["prompt"]}], "answer": row["answer"]} for row in STANDARD]
CONVERSATIONAL[0]["prompt"].insert(0, {"role": "system", "content": "You add."})



def write(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def trl_prompt_ids(folder, prompts):
    """``GRPOTrainer._tokenize_prompts`` run as the trainer runs it, on ``folder``'s tokenizer."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    trainer = types.SimpleNamespace(processing_class=tokenizer, _is_vlm=False, environment_factories=None, tools=None,
                                    chat_template=None, chat_template_kwargs={})
    return [list(ids) for ids in trl.GRPOTrainer._tokenize_prompts(trainer, prompts)[0]]


@pytest.mark.parametrize("rows", [STANDARD, CONVERSATIONAL], ids=["standard", "conversational"])
@pytest.mark.parametrize("tokenizer", ["chatml", "llama3"])
def test_prompts_are_tokenized_as_trl_tokenizes_them(tmp_path, rows, tokenizer):
    folder = (chatml_bos_folder if tokenizer == "chatml" else llama3_folder)(tmp_path / tokenizer)
    data = DataConfig(source="jsonl", path=str(write(tmp_path / "prompts.jsonl", rows)),
                      tokenizer=str(folder / "tokenizer.json"))
    prompts = Prompts.read(data, num_generations=4, completion_length=8)
    assert [ids.tolist() for ids in prompts.ids] == trl_prompt_ids(folder, [row["prompt"] for row in rows])
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    ends = {hf.eos_token_id} | ({hf.convert_tokens_to_ids("<|im_end|>" if tokenizer == "chatml" else "<|eot_id|>")}
                                if rows is CONVERSATIONAL else set())
    assert set(prompts.stop_tokens) == ends
    if rows is STANDARD and tokenizer == "chatml":
        assert all(ids[0] == 3 for ids in prompts.ids)  # the BOS the tokenizer adds


def test_byte_prompts_split_and_their_columns(tmp_path):
    data = DataConfig(source="jsonl", path=str(write(tmp_path / "p.jsonl", STANDARD)), val_fraction=0.2, seed=3)
    prompts = Prompts.read(data, num_generations=2, completion_length=4)
    assert prompts.ids[0].tolist() == list(STANDARD[0]["prompt"].encode()) and prompts.stop_tokens == (256,)
    assert len(prompts.split["val"]) == 2 and sorted(prompts.split["val"] + prompts.split["train"]) == list(range(10))
    assert prompts.columns(np.array([4, 1])) == {"answer": ["9", "3"], "id": [4, 1]}
    conversational = Prompts.read(DataConfig(source="jsonl", path=str(write(tmp_path / "c.jsonl", CONVERSATIONAL))),
                                  num_generations=2, completion_length=4)
    text = "<|system|>\nYou add." + EOT + "\n<|user|>\n" + STANDARD[0]["prompt"] + EOT + "\n<|assistant|>\n"
    assert conversational.tokenizer.decode(conversational.ids[0].tolist()) == text
    assert conversational.ids[0].tolist().count(256) == 2 and conversational.stop_tokens == (256,)
    assert (prompts.conversational, conversational.conversational) == (False, True)  # sampled with --prompt, --chat


def test_a_step_draws_prompts_in_a_seeded_order_each_process_its_share(tmp_path):
    data = DataConfig(source="jsonl", path=str(write(tmp_path / "p.jsonl", STANDARD)), val_fraction=0.2)
    prompts = Prompts.read(data, num_generations=2, completion_length=4)
    whole = prompts.loader("train", seq_len=64, batch_size=8, seed=5)  # 8 completions: 4 prompts
    steps = [next(whole) for _ in range(4)]  # 16 prompts: two epochs of 8
    assert all(step.shape == (4,) for step in steps)
    first, second = np.concatenate(steps[:2]), np.concatenate(steps[2:])
    assert sorted(first) == sorted(second) == prompts.split["train"] and not np.array_equal(first, second)
    halves = [prompts.loader("train", seq_len=64, batch_size=4, seed=5, process_index=p, process_count=2)
              for p in range(2)]
    assert np.array_equal(np.concatenate([next(h) for h in halves]), steps[0])
    resumed = prompts.loader("train", seq_len=64, batch_size=8, seed=5)
    resumed.set_state(whole.get_state())
    assert np.array_equal(next(resumed), next(whole))


def test_prompts_without_room_for_a_completion_are_dropped_and_counted(tmp_path, capsys):
    rows = [{"prompt": "x" * n} for n in (4, 4, 30, 4, 30)]
    prompts = Prompts.read(DataConfig(source="jsonl", path=str(write(tmp_path / "p.jsonl", rows)), val_fraction=0.2),
                           num_generations=2, completion_length=8)
    assert all(len(prompts.ids[i]) == 4 for i in prompts.fitting("train", seq_len=20))
    assert "dropped" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="no .* prompt fits architecture.seq_len \\+ 1 = 9 tokens with "
                                          "grpo.max_completion_length=8"):
        prompts.fitting("train", seq_len=8)


@pytest.mark.parametrize(("rows", "says"), [
    ([{"text": "a"}, {"text": "b"}], r"line 1 has no field 'prompt' \(it has 'text'\)"),
    ([{"prompt": "a"}, {"prompt": [{"role": "user", "content": "b"}]}], "mixes prompts that are strings"),
    ([{"prompt": "a"}, {"prompt": 3}], "line 2, field 'prompt', must be a non-empty list"),
    ([{"prompt": "a"}], "holds 1 prompt row"),
])
def test_bad_rows_are_one_line(tmp_path, rows, says):
    with pytest.raises(ConfigError, match=says) as error:
        Prompts.read(DataConfig(source="jsonl", path=str(write(tmp_path / "p.jsonl", rows))), 2, 4)
    assert "\n" not in str(error.value)


def test_a_fitted_vocabulary_and_a_text_source_are_refused(tmp_path):
    path = str(write(tmp_path / "p.jsonl", STANDARD))
    with pytest.raises(ConfigError, match="data.tokenizer=char fitted to the prompts"):
        Prompts.read(DataConfig(source="jsonl", path=path, tokenizer="char"), 2, 4)
    with pytest.raises(ConfigError, match="not data.source=text"):
        Prompts.read(DataConfig(source="text", path=path), 2, 4)
