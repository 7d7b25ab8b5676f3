"""The commands a run prints at its end for its user to run next (``next:``), run as printed, in
the folder the run ran in: the README's SFT demo (``sft_tiny``) samples, evaluates, exports (a
``llama`` folder that transformers loads, with its chat template) and continues; a model that
no Hugging Face config.json expresses is not offered an export.

The other printed commands run elsewhere: ``resume:`` in tests/training/test_lifecycle.py and
tests/e2e/test_resume.py, a sweep job's ``continue:`` in tests/e2e/test_user_project.py;
``W&B:`` (``wandb sync``) uploads to an account, which a test machine has not.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import run_python

pytestmark = pytest.mark.slow  # real runs in subprocesses

SHORT = ("trainer.max_steps=4", "trainer.eval_every=4", "trainer.checkpoint_every=4", "trainer.eval_batches=1",
         "data.max_files=40", "logger.mode=disabled")


def next_commands(output: str) -> dict[str, str]:
    """``{name: command}`` of the ``next:`` block a run's end prints."""
    block = output.split("\nnext:\n", 1)[1]
    return dict(re.findall(r"^  (\w[\w&]*): +(.+)$", block, flags=re.M))


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess:
    """``command`` as a user's shell runs it, ``python`` being this environment's."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_every_command_the_sft_demo_offers_runs(tmp_path):
    from interop.hf_models import transformers

    proc = run_python("-m", "theseus.run", "+experiment=sft_tiny", "hydra.run.dir=outputs/sft", *SHORT, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    offered = next_commands(proc.stderr)
    assert set(offered) == {"sample", "evaluate", "export", "continue"}, offered
    for name, command in offered.items():
        done = shell(command.replace("trainer.max_steps=N", "trainer.max_steps=6"), tmp_path)
        assert done.returncode == 0 and "Traceback" not in done.stderr, f"{name}: {command}\n{done.stderr[-3000:]}"
        if name == "sample":
            assert done.stdout.strip(), "the chat model replied nothing"
    run = tmp_path / "outputs" / "sft"
    exported = Path(f"{run}-hf")
    assert transformers.AutoConfig.from_pretrained(exported).model_type == "llama"
    assert transformers.AutoTokenizer.from_pretrained(exported).chat_template  # the template it trained with
    assert (run / "eval-4.json").is_file() and (Path(f"{run}-more") / "checkpoints" / "6").is_dir()


def test_a_model_without_a_hugging_face_format_is_offered_no_export(tmp_path):
    """GPT-2's layout with rotary positions: neither gpt2 (learned positions) nor llama (RMSNorm)."""
    proc = run_python("-m", "theseus.run", "+experiment=gpt_tiny", "architecture.positions=rope", "trainer.max_steps=2",
                      "trainer.eval_every=2", "trainer.eval_batches=1", "logger.mode=disabled", "hydra.run.dir=run",
                      cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    offered = next_commands(proc.stderr)
    assert {"sample", "evaluate", "continue"} <= set(offered) and "export" not in offered, offered
    refused = shell(f"python -m theseus.export {tmp_path / 'run'} {tmp_path / 'hf'}", tmp_path)
    assert refused.returncode == 2 and "has no Hugging Face model_type" in refused.stderr  # what it was not offered
