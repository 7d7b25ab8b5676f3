"""task=sft as a user runs it: a Hugging Face folder with a ChatML template fine-tuned on a JSONL
file of conversations, its val_loss equal to transformers' masked mean over the validation
conversations, sampled with --chat; a Llama folder fine-tuned with LoRA adapters, evaluated,
sampled and exported both ways (merged, and peft's adapter); bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from data.chat_folders import chatml_folder
from e2e.test_next_commands import next_commands, shell
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
    proc = run_python("-m", "theseus.run", f"trainer.init_from={project / 'qwen'}", *DATA, f"data.cache_dir={project}/cache",
                      "trainer.max_steps=4",
                      "trainer.batch_size=4", "trainer.eval_every=4", "trainer.checkpoint_every=4",
                      "logger.mode=disabled", f"hydra.run.dir={run}", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert np.isfinite([r["val_loss"] for r in logged if "val_loss" in r]).all()
    more = shell(next_commands(proc.stderr)["continue"].replace("trainer.max_steps=N", "trainer.max_steps=5"), project)
    assert more.returncode == 0, more.stderr[-3000:]  # the folder's architecture and tokenizer, through the run
    assert (Path(f"{run}-more") / "checkpoints" / "5").is_dir()

    proc = run_python("-m", "theseus.sample", str(run), "--chat", "What is 3 plus 4?", "--temperature", "0",
                      "--max-new-tokens", "12", cwd=project)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "<|im_end|>" not in proc.stdout and "<|im_start|>" not in proc.stdout

    proc = run_python("-m", "theseus.evaluate", str(project / "qwen"), *DATA, f"data.cache_dir={project}/cache",
                      "--out", str(project / "eval.json"), cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    val_loss = json.loads((project / "eval.json").read_text())["metrics"]["val_loss"]
    held = held_out(chats(), project / "qwen")
    assert len(held) == 12
    reference = transformers_val_loss(project / "qwen", project / "qwen", [chats()[i]["messages"] for i in held])
    assert val_loss == pytest.approx(reference, abs=1e-4)

    # the SFT run scored on preference pairs, the baseline of a DPO run from it: task=dpo, every pair of the file
    pairs = [{"prompt": [{"role": "user", "content": f"What is {a} plus {b}?"}],
              "chosen": [{"role": "assistant", "content": f"{a} plus {b} is {a + b}."}],
              "rejected": [{"role": "assistant", "content": f"{a} plus {b} is {a + b + 1}."}]} for a in range(4)
             for b in range(5)]
    (project / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in pairs))
    proc = run_python("-m", "theseus.evaluate", str(run), "task=dpo", "data.source=jsonl", "data.path=pairs.jsonl",
                      "dpo.reference=none", f"data.cache_dir={project}/cache", "--out", "pairs.json", cwd=project)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((project / "pairs.json").read_text())
    assert record["split"] == "all" and record["scored"] == "every example of data.path=pairs.jsonl"
    metrics = record["metrics"]  # reference-free: a reward is beta (0.1) x the policy's log-prob
    assert metrics["val_rewards/chosen"] == pytest.approx(0.1 * metrics["val_logps/chosen"], rel=1e-5)
    assert metrics["val_logps/chosen"] < 0 and metrics["val_loss"] > 0


def sums(n: int = 120) -> list[dict]:
    """Questions whose answers are short (``"7."``): a few steps teach a reply and its end of turn."""
    return [{"messages": [{"role": "user", "content": f"What is {a} plus {b}?"},
                          {"role": "assistant", "content": f"{a + b}."}]} for a, b in (divmod(i, 11) for i in range(n))]


LORA = ("architecture.lora.rank=4", "architecture.lora.targets=[q,k,v,o,gate,up,down]", "architecture.seq_len=64",
        "optimizer.lr=1e-2", "optimizer.warmup_steps=5", "trainer.max_steps=80", "trainer.batch_size=8",
        "trainer.log_every=10", "trainer.eval_every=80", "trainer.checkpoint_every=80")


def test_lora_fine_tune_of_a_llama_folder_evaluates_samples_and_exports_both_ways(tmp_path):
    """A tiny Llama (a ChatML tokenizer folder) fine-tuned with rank-4 adapters as the README runs it:
    the loss goes down; ``theseus.evaluate RUN`` gives transformers' masked mean of the merged export
    over the validation conversations, below the base's; ``--chat`` at temperature 0 replies what
    transformers' greedy generation replies, up to ``<|im_end|>``; the merged export computes
    theseus's logits, and peft's adapter on the base computes the merged export's."""
    from interop.hf_models import hf_logits, llama_config, save_hf, torch, transformers

    peft = pytest.importorskip("peft")
    from theseus.cli.trained import load_trained

    config = llama_config()
    config.vocab_size, config.max_position_embeddings = 400, 128
    base = chatml_folder(save_hf(transformers.LlamaForCausalLM(config), tmp_path / "llama", tokenizer=False))
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in sums()))
    run, merged, adapter = tmp_path / "run", tmp_path / "merged", tmp_path / "adapter"
    proc = run_python("-m", "theseus.run", f"trainer.init_from={base}", *DATA, *LORA, f"data.cache_dir={tmp_path}/cache",
                      "logger.mode=disabled", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in logged if "loss" in r]
    assert losses[-1] < losses[0] - 1.0, losses
    assert f"python -m theseus.sample {run} --chat" in proc.stderr  # the end report's next command: a chat
    for args in ((str(run), str(merged)), (str(run), str(adapter), "--adapter")):
        proc = run_python("-m", "theseus.export", *args, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]

    trained = load_trained(run)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, size=(2, 24))
    ours = np.asarray(trained.model.apply({"params": trained.params}, tokens))
    np.testing.assert_allclose(hf_logits(merged, tokens), ours, atol=1e-4, rtol=0)
    adapted = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(base), adapter).eval()
    with torch.no_grad():
        theirs = adapted(torch.from_numpy(tokens)).logits.numpy()
    assert np.abs(theirs - hf_logits(base, tokens)).max() > 1e-2  # peft applies the trained adapters ...
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)  # ... and computes the merged model

    proc = run_python("-m", "theseus.evaluate", str(run), "--out", str(tmp_path / "eval.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    val_loss = json.loads((tmp_path / "eval.json").read_text())["metrics"]["val_loss"]
    assert val_loss == pytest.approx([r["val_loss"] for r in logged if "val_loss" in r][-1], abs=1e-5)
    validation = [sums()[i]["messages"] for i in held_out(sums(), base)]
    assert val_loss == pytest.approx(transformers_val_loss(merged, base, validation), abs=1e-4)
    assert val_loss < transformers_val_loss(base, base, validation) - 1.0

    message = "What is 3 plus 4?"
    proc = run_python("-m", "theseus.sample", str(run), "--chat", message, "--temperature", "0",
                      "--max-new-tokens", "16", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    chat = transformers.AutoTokenizer.from_pretrained(base)
    prompt = torch.tensor([chat.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                                    return_dict=True)["input_ids"]])
    end = chat.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        greedy = transformers.AutoModelForCausalLM.from_pretrained(merged).generate(
            prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=16, eos_token_id=end,
            pad_token_id=end)[0, prompt.shape[1]:].tolist()
    assert end in greedy, chat.decode(greedy)  # the reply ends its turn ...
    assert proc.stdout == chat.decode(greedy[:greedy.index(end)]) + "\n"  # ... where theseus stops


def test_a_char_run_samples_and_exports_with_the_default_template(tmp_path):
    """sft_tiny with data.tokenizer=char (Llama's layout: it exports): the vocabulary is
    fitted to the rendered conversations and kept in the cache, where --chat finds it again; the
    export carries the default template, so transformers renders the same prompt and its greedy
    generation, up to <|endoftext|>, is the reply --chat prints."""
    from interop.hf_models import torch, transformers

    run, out, message = tmp_path / "run", tmp_path / "hf", "What does json.dumps do?"
    proc = run_python("-m", "theseus.run", "+experiment=sft_tiny", "data.tokenizer=char", "data.max_files=40",
                      "trainer.max_steps=3", "trainer.eval_every=3",
                      "trainer.checkpoint_every=3", f"data.cache_dir={tmp_path}/cache", "logger.mode=disabled",
                      f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name.split("-")[:3] for p in (tmp_path / "cache").iterdir()] == [["chats", "stdlib", "char"]]
    proc = run_python("-m", "theseus.export", str(run), str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_python("-m", "theseus.sample", str(run), "--chat", message, "--temperature", "0",
                      "--max-new-tokens", "12", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    chat = transformers.AutoTokenizer.from_pretrained(out)
    prompt = chat.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                      return_dict=True)["input_ids"]
    assert chat.decode(prompt) == f"<|user|>\n{message}<|endoftext|>\n<|assistant|>\n"
    assert chat.convert_tokens_to_ids("<|endoftext|>") == len(chat) - 1  # one token, after the characters
    ids = torch.tensor([prompt])
    with torch.no_grad():
        greedy = transformers.AutoModelForCausalLM.from_pretrained(out).generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
            eos_token_id=chat.eos_token_id, pad_token_id=chat.eos_token_id)[0, len(prompt):].tolist()
    reply = greedy[:greedy.index(chat.eos_token_id)] if chat.eos_token_id in greedy else greedy
    assert proc.stdout == chat.decode(reply) + "\n"


def held_out(rows: list[dict], folder: Path, val_fraction: float = 0.1) -> list[int]:
    """The rows a run of ``folder``'s tokenizer holds out for validation (seed 0): theseus's split."""
    from theseus.data.chat import ChatTemplate
    from theseus.data.conversations import Conversations
    from theseus.data.tokenizer import HFTokenizer

    tokenizer = folder / "tokenizer.json"
    return Conversations.encode(rows, ChatTemplate.find(str(tokenizer)), HFTokenizer.from_file(tokenizer),
                                val_fraction=val_fraction, seed=0).rows["val"]


def transformers_val_loss(model: Path, tokenizer: Path, conversations: list[list[dict]]) -> float:
    """The mean, over every assistant token of ``conversations``, of transformers' cross-entropy
    (labels -100 outside apply_chat_template's assistant_masks) of the model folder ``model``.
    The folder's tokenizer.json as written: for a qwen2 folder AutoTokenizer builds Qwen2's own
    pre-tokenizer (digits one by one), which this test's GPT-2-style BPE does not have."""
    from interop.hf_models import torch, transformers

    chat = transformers.PreTrainedTokenizerFast.from_pretrained(tokenizer)
    lm = transformers.AutoModelForCausalLM.from_pretrained(model).eval()
    total = count = 0.0
    for messages in conversations:
        out = chat.apply_chat_template(messages, return_dict=True, return_assistant_tokens_mask=True)
        ids = torch.tensor([out["input_ids"]])
        labels = torch.where(torch.tensor([out["assistant_masks"]]) == 1, ids, -100)
        with torch.no_grad():
            loss = lm(ids, labels=labels).loss
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
