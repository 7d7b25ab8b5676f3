"""The extension points a user subclasses keep their signatures (issue 51): an attention written to
the README's shape, ``__call__(self, x, positions, deterministic=True)``, serves a plain LM run,
LoRA and a sharded mesh; task=sft, which packs conversations and passes segments=, takes one that
accepts them and refuses the other in one line naming the signature, before the run is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e.test_sft import chats

from support import run_python

pytestmark = pytest.mark.slow  # end to end: real runs in subprocesses

USER_MODELS = '''\
from theseus.config import register
from theseus.model.layers import Attention, Block
from theseus.model.models.gpt import GPT


class HalfAttention(Attention):  # the README's shape, written before packing existed
    def __call__(self, x, positions, deterministic=True):  # x: [batch, seq, d_model]
        return 0.5 * super().__call__(x, positions, deterministic=deterministic)


class PackedHalfAttention(Attention):  # the same, taking packed sequences
    def __call__(self, x, positions, deterministic=True, segments=None):
        return 0.5 * super().__call__(x, positions, deterministic=deterministic, segments=segments)


class HalfBlock(Block):
    attention_cls = HalfAttention


class PackedHalfBlock(Block):
    attention_cls = PackedHalfAttention


@register("model", "half_gpt")
class HalfGPT(GPT):
    block_cls = HalfBlock


@register("model", "packed_half_gpt")
class PackedHalfGPT(GPT):
    block_cls = PackedHalfBlock
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("myproj")
    (root / "mymodels.py").write_text(USER_MODELS)
    (root / "pyproject.toml").write_text('[project]\nname = "myproj"\nversion = "0.1"\n\n'
                                         '[tool.theseus]\nimports = ["mymodels"]\n')
    (root / "chats.jsonl").write_text("".join(json.dumps(row) + "\n" for row in chats(60)))
    return root


def run(project: Path, *args: str):
    return run_python("-m", "theseus.run", "+experiment=gpt_tiny", "trainer.max_steps=2", "trainer.batch_size=4",
                      "trainer.eval_every=2", "trainer.eval_batches=1", "trainer.checkpoint_every=2",
                      f"data.cache_dir={project / 'cache'}", "data.max_files=20", "logger.mode=disabled", *args,
                      cwd=project)


def test_a_plain_lm_run_with_lora_on_a_sharded_mesh_takes_the_old_signature(project):
    """task=lm, LoRA adapters on q and v, FSDP x tensor over 4 devices: the attention is called
    as it was written, without segments=."""
    proc = run(project, "model=half_gpt", "architecture.lora.rank=4", "mesh.cpu_devices=4", "mesh.data=1",
               "mesh.fsdp=2", "mesh.tensor=2", "hydra.run.dir=lm")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (project / "lm" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and "val_loss" in rows[-1]


SFT = ("task=sft", "data.source=jsonl", "data.path=chats.jsonl", "data.val_fraction=0.1", "architecture.seq_len=128",
       "architecture.positions=rope")


def test_sft_packing_refuses_an_attention_without_segments_and_takes_one_with_them(project):
    proc = run(project, "model=half_gpt", *SFT, "hydra.run.dir=refused")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "theseus: error: mymodels.HalfAttention.__call__(self, x, positions, deterministic=True) takes no "
        "segments=, which task=sft passes (its conversations packed in windows, each attending to itself): add a "
        "`segments=None` parameter and pass it on (super().__call__(..., segments=segments))")
    assert not (project / "refused").exists()

    proc = run(project, "model=packed_half_gpt", *SFT, "hydra.run.dir=sft")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (project / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 2 and "val_loss" in rows[-1]
