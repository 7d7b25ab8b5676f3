"""task=sft as a user runs it: a Hugging Face folder with a ChatML template fine-tuned on a JSONL
file of conversations, its val_loss equal to transformers' masked mean over the validation
conversations, sampled with --chat; bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from data.chat_folders import chatml_folder
from support import run_python

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses


def chats(n: int = 120) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = divmod(i, 11)
        messages = [{"role": "user", "content": f"What is {a} plus {b}?"},
                    {"role": "assistant", "content": f"{a} plus {b} is {a + b}."}]
        if i % 3 == 0:
            messages = [{"role": "system", "content": "You add numbers."}, *messages,
                        {"role": "user", "content": "Thanks!"}, {"role": "assistant", "content": "Welcome."}]
        rows.append({"messages": messages})
    return rows


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A folder with ``qwen/`` (a tiny Qwen2 and a ChatML tokenizer folder) and ``chats.jsonl``."""
    from interop.hf_models import qwen2_config, save_hf, transformers

    base = tmp_path_factory.mktemp("sft")
    config = qwen2_config()
    config.vocab_size, config.max_position_embeddings = 400, 128
    chatml_folder(save_hf(transformers.Qwen2ForCausalLM(config), base / "qwen", tokenizer=False))
    (base / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in chats()))
    return base


DATA = ("task=sft", "data.source=jsonl", "data.path=chats.jsonl", "data.val_fraction=0.1")


def test_fine_tune_evaluate_and_chat(project):
    run = project / "run"
    proc = run_python("-m", "theseus.run", f"trainer.init_from={project / 'qwen'}", *DATA, "trainer.max_steps=4",
                      "trainer.batch_size=4", "trainer.eval_every=4", "trainer.checkpoint_every=4",
                      "logger.mode=disabled", f"hydra.run.dir={run}", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert np.isfinite([r["val_loss"] for r in logged if "val_loss" in r]).all()

    proc = run_python("-m", "theseus.sample", str(run), "--chat", "What is 3 plus 4?", "--temperature", "0",
                      "--max-new-tokens", "12", cwd=project)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "<|im_end|>" not in proc.stdout and "<|im_start|>" not in proc.stdout

    proc = run_python("-m", "theseus.evaluate", str(project / "qwen"), *DATA, "--out", str(project / "eval.json"),
                      cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    val_loss = json.loads((project / "eval.json").read_text())["metrics"]["val_loss"]
    assert val_loss == pytest.approx(transformers_val_loss(project), abs=1e-4)


def transformers_val_loss(project: Path) -> float:
    """The mean, over every assistant token of the validation conversations, of transformers'
    cross-entropy (labels -100 outside apply_chat_template's assistant_masks)."""
    from interop.hf_models import torch, transformers

    from theseus.data.chat import ChatTemplate
    from theseus.data.conversations import Conversations
    from theseus.data.tokenizer import HFTokenizer

    folder = project / "qwen"
    # which conversations are held out: theseus's split of the file (seed 0, val_fraction 0.1)
    held_out = Conversations.encode(chats(), ChatTemplate.find(str(folder / "tokenizer.json")),
                                    HFTokenizer.from_file(folder / "tokenizer.json"), val_fraction=0.1, seed=0).rows["val"]
    assert len(held_out) == 12
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    total = count = 0.0
    for i in held_out:
        out = tokenizer.apply_chat_template(chats()[i]["messages"], return_dict=True, return_assistant_tokens_mask=True)
        ids = torch.tensor([out["input_ids"]])
        labels = torch.where(torch.tensor([out["assistant_masks"]]) == 1, ids, -100)
        with torch.no_grad():
            loss = model(ids, labels=labels).loss
        n = int((labels[0, 1:] != -100).sum())
        total, count = total + float(loss) * n, count + n
    return total / count


@pytest.mark.parametrize("overrides, message", [
    (["data.source=text"], "theseus: error: task=sft reads conversations, not data.source=text: use data.source=jsonl"),
    (["data.chat_field=chat"], "has no field 'chat' (it has 'messages'): set data.chat_field"),
    (["data.train_on=some"], "data.train_on"),
])
def test_bad_input_is_one_line(project, overrides, message):
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tiny", *DATA, *overrides, "trainer.max_steps=1",
                      f"hydra.run.dir={project / 'bad'}", cwd=project)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("theseus: error: ") and message in lines[0]
    assert not (project / "bad").exists()
