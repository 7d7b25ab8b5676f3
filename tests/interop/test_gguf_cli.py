"""A GGUF file as a user meets it, from the command line in a folder outside the checkout:
``theseus.sample FILE.gguf``, ``theseus.evaluate FILE.gguf``, ``theseus.export FILE.gguf OUT``,
and a LoRA fine-tune with ``trainer.init_from=FILE.gguf`` whose checkpoints name the file."""

from __future__ import annotations

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from interop.gguf_files import CHATML, EVERY_KIND, byte_level_vocabulary, llama_config, random_model, \
    transformers_tokenizer, write_gguf
from interop.hf_models import CORPUS, hf_logits, hf_model, hf_val_loss, torch, transformers
from interop.test_gguf import TEXTS

from support import run_python
from theseus.data.gguf_file import open_gguf

pytestmark = pytest.mark.slow  # real runs in subprocesses
DATA = ["data.source=text", "data.val_fraction=0.1"]


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    """A Llama GGUF file, its 2-D weights in every kind in turn."""
    return write_gguf(random_model(llama_config()), byte_level_vocabulary(), tmp_path_factory.mktemp("gguf") /
                      "tiny.gguf", kinds=EVERY_KIND)


def data_args(tmp):
    """A text corpus in ``tmp``, as ``data.*`` overrides."""
    if not (tmp / "mine.txt").is_file():
        (tmp / "mine.txt").write_text(CORPUS.read_text() * 2)
    return [*DATA, f"data.path={tmp / 'mine.txt'}", f"data.cache_dir={tmp / 'cache'}"]


def test_sample_evaluate_and_export_a_gguf_file(gguf_file, tmp_path):
    message = "Say something."
    proc = run_python("-m", "theseus.sample", str(gguf_file), "--chat", message, "--temperature", "0",
                      "--max-new-tokens", "12", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tokenizer, reference = transformers_tokenizer(gguf_file), hf_model(gguf_file)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    with torch.no_grad():
        new = reference.generate(**prompt, do_sample=False, max_new_tokens=12)[0, prompt["input_ids"].shape[1]:]
    new = new.tolist()
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert proc.stdout[:-1] == tokenizer.decode(new[: new.index(end) if end in new else len(new)])

    proc = run_python("-m", "theseus.evaluate", str(gguf_file), *data_args(tmp_path), "architecture.seq_len=32",
                      "trainer.batch_size=2", "trainer.eval_batches=2", "--out", str(tmp_path / "eval.json"),
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    val_loss = json.loads((tmp_path / "eval.json").read_text())["metrics"]["val_loss"]
    assert val_loss == pytest.approx(hf_val_loss(gguf_file, data_args(tmp_path), 32, 2, 2), rel=1e-4)

    out = tmp_path / "exported"
    proc = run_python("-m", "theseus.export", str(gguf_file), str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json",
                                                         "tokenizer_config.json"]
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["max_position_embeddings"], config["eos_token_id"]) == ("llama", 128, 2)
    tokens = np.random.default_rng(0).integers(0, 320, size=(2, 24))
    np.testing.assert_allclose(hf_logits(out, tokens), hf_logits(gguf_file, tokens), atol=1e-5, rtol=0)
    exported = transformers.AutoTokenizer.from_pretrained(out)
    assert exported.chat_template == CHATML
    for text in TEXTS:
        assert exported(text)["input_ids"] == tokenizer(text)["input_ids"], text


def test_a_lora_fine_tune_of_a_gguf_file_names_it_as_its_base(gguf_file, tmp_path):
    """A LoRA run from the file: evaluated at step 0 as transformers evaluates the file, its
    checkpoints naming the file (exported merged), refused once the file changes."""
    gguf_file = shutil.copy(gguf_file, tmp_path / "base.gguf")
    run = tmp_path / "run"
    proc = run_python("-m", "theseus.run", f"trainer.init_from={gguf_file}", *data_args(tmp_path),
                      "architecture.lora.rank=4", "architecture.lora.targets=[q,v,down]", "optimizer.lr=1e-2",
                      "trainer.max_steps=2", "trainer.batch_size=2", "trainer.eval_batches=1", "trainer.log_every=1",
                      "architecture.seq_len=32", "logger.mode=disabled", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluations = [(m["step"], m["val_loss"]) for m in logged if "val_loss" in m]
    assert [step for step, _ in evaluations] == [0, 2]
    assert evaluations[0][1] == pytest.approx(hf_val_loss(gguf_file, data_args(tmp_path), 32, 2, 1), rel=1e-4)

    out = tmp_path / "merged"
    proc = run_python("-m", "theseus.export", str(run), str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from theseus.sources.parse import parse_source
    from theseus.cli.trained import load_trained

    restored = load_trained(parse_source(run, key=None))
    tokens = np.random.default_rng(1).integers(0, 320, size=(2, 32))
    ours = np.asarray(restored.model.apply({"params": restored.params}, jnp.asarray(tokens)))
    merged, original = hf_logits(out, tokens), hf_logits(gguf_file, tokens)
    assert np.abs(merged - original).max() > 1e-3  # the adapters trained ...
    np.testing.assert_allclose(ours, merged, atol=1e-4, rtol=0)  # ... and merge into the file's weights
    proc = run_python("-m", "theseus.export", str(run), str(tmp_path / "adapter"), "--adapter", cwd=tmp_path)
    assert proc.returncode == 2 and "peft loads no GGUF file" in proc.stderr

    data = bytearray(gguf_file.read_bytes())  # the file changes under the run: one bit of one tensor
    data[open_gguf(gguf_file).tensors["blk.1.attn_v.weight"].begin + 5] ^= 1
    gguf_file.write_bytes(data)
    proc = run_python("-m", "theseus.sample", str(run), "--prompt", "def", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("theseus: error: checkpoint ")
    assert f"holds LoRA adapters trained on the base {gguf_file}, but the weights in {gguf_file} are not " \
           f"that base's" in proc.stderr
