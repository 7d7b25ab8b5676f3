"""The README is a test: every shell command in its fenced ``bash`` blocks runs as written.

Each ``##`` section of README.md runs as one bash script, in a fresh folder outside the
checkout, with the files that stand for the reader's own (``my_notes.txt``, a small local Hugging
Face model at ``$HOME/models/my-llama``); every other file a section uses, it makes. A ``python``
block whose first line or ``yaml`` block whose first line names a file (``# myproj/mymodels.py``)
is written there; any other ``python`` block runs as a script where the shell stands. Long jobs
are shortened only by overrides appended to their command (``SHORTEN``); commands that need
another machine are replaced, by name, with the reason (``SKIP``). Every command must exit 0,
with no traceback. A ``text`` block that shows a command (``$ COMMAND``) and what it prints must
be what that command prints.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, bare_env

from theseus.base.hardware import CACHE

pytestmark = pytest.mark.slow

README = ROOT / "README.md"

# The set-up of the two first commands: .ci/run runs these words itself in the checkout (the
# README's test line), so here the checkout's environment stands in as ./.venv.
SETUP = re.compile(r'^python3 -m venv \.venv && \.venv/bin/pip install -c constraints\.txt -e (\.|"\.\[test\]") && ')

# command text -> why it does not run here
SKIP = {
    ".venv/bin/python -m pytest": "the README's test command: .ci/run runs this very line",
    "distributed.coordinator=10.0.0.1": "the other host, 10.0.0.1, is another machine",
    "hydra/launcher=slurm": "needs a SLURM cluster (tests/e2e/test_slurm.py runs one)",
    "gcloud compute tpus": "needs a Cloud TPU pod",
}

# words of a command -> overrides appended to every command holding them (the last value of a key wins)
SHORTEN = {
    "+experiment=gpt_small": "trainer.max_steps=2 trainer.eval_batches=1",
    "+experiment=moe_small": "trainer.max_steps=2 trainer.eval_batches=1",
    "+experiment=sft_tiny": "trainer.max_steps=10",
    # every pair, as the README has them: its evaluation once hung on 2 CPU devices past 32 batches in flight
    "+experiment=dpo_tiny": "trainer.max_steps=4 trainer.eval_every=2",
    "+sweep=lr_optuna": "hydra.sweeper.n_trials=2 trainer.max_steps=10",
    "+sweep=lr": "trainer.max_steps=10",
    "trainer.init_from=$HOME/models/my-llama": "trainer.max_steps=3 trainer.batch_size=4 trainer.eval_batches=1",
    "trainer.init_from=smollm2": "trainer.max_steps=2 trainer.eval_batches=1",
    "outputs/smol-lora --chat": "--max-new-tokens 24",  # two steps in, the reply need not end by itself
    "data.path=reverse_chats.jsonl": "trainer.max_steps=20",  # tests/e2e/test_grpo.py runs the GRPO section whole
    "+experiment=grpo_tiny": "trainer.max_steps=4 trainer.eval_every=2",
}


def sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """``{section title: [(language, code), ...]}`` for the ``##`` sections holding ``bash``."""
    out: dict[str, list[tuple[str, str]]] = {}
    title = ""
    for part in re.split(r"^(## .*)$", text, flags=re.M):
        if part.startswith("## "):
            title = part[3:].strip()
            continue
        blocks = re.findall(r"^```(\w+)\n(.*?)^```", part, flags=re.M | re.S)
        if any(lang == "bash" for lang, _ in blocks):
            out[title] = [(lang, code) for lang, code in blocks if lang in ("bash", "python", "yaml")]
    return out


def commands(code: str) -> list[str]:
    """The shell commands of a bash block: continuation lines joined, a here-document kept whole."""
    out: list[str] = []
    lines = code.splitlines()
    while lines:
        line = lines.pop(0)
        while line.endswith("\\") and lines:
            line = line[:-1] + " " + lines.pop(0).strip()
        heredoc = re.search(r"<<-?'?(\w+)'?", line)
        if heredoc:
            body = []
            while lines and lines[0] != heredoc.group(1):
                body.append(lines.pop(0))
            line = "\n".join([line, *body, lines.pop(0) if lines else heredoc.group(1)])
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(line)
    return out


def rewrite(command: str, used: set[str]) -> str:
    """``command`` as this test runs it: set-up dropped, skipped by reason, or shortened (the
    keys of SKIP and SHORTEN it holds are added to ``used``)."""
    for text, reason in SKIP.items():
        if text in command:
            used.add(text)
            return f": skipped: {shlex.quote(command)}: {shlex.quote(reason)}"
    first, newline, rest = SETUP.sub("", command, count=1).partition("\n")  # rest: a here-document's body
    first = first.split("  #")[0].rstrip()
    for words, overrides in SHORTEN.items():
        if re.search(rf"(?<!\S){re.escape(words)}(?!\S)", first):
            used.add(words)
            first = f"{first} {overrides}"
    return first + newline + rest


def script(blocks: list[tuple[str, str]], used: set[str]) -> str:
    """One bash script for a section: each command echoed, then run; files written."""
    out = ["set -euo pipefail"]
    for lang, code in blocks:
        first = code.splitlines()[0] if code else ""
        target = re.fullmatch(r"# (\S+\.(py|yaml))", first.strip())
        if target:  # a file of the user's project, relative to the folder the section starts in
            out.append(f'mkdir -p "$(dirname "$START/{target.group(1)}")"')
            out.append(f'cat > "$START/{target.group(1)}" <<\'FILE\'\n{code}FILE')
            continue
        if lang == "python":
            out.append(f"echo '$ python <<PYTHON'\npython - <<'PYTHON'\n{code}PYTHON")
        if lang != "bash":
            continue
        for command in commands(code):
            shown = command.splitlines()[0]
            out.append(f"echo {shlex.quote('$ ' + shown)}")
            out.append(rewrite(command, used))
    return "\n".join(out) + "\n"


def project(folder: Path, needs_model: bool) -> dict[str, str]:
    """The reader's own files the README's text names, in ``folder`` (also ``HOME``); returns the environment."""
    notes = "".join(Path(m.__file__).read_text(encoding="utf-8") for m in (json.decoder, json.encoder, re))
    (folder / "my_notes.txt").write_text(notes * 3, encoding="utf-8")
    (folder / ".venv").symlink_to(sys.prefix)
    if needs_model:
        from interop.hf_models import save_hf, transformers

        config = transformers.LlamaConfig(vocab_size=333, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                          tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                                          pad_token_id=None)
        (folder / "models" / "my-llama").mkdir(parents=True)
        save_hf(transformers.LlamaForCausalLM(config), folder / "models" / "my-llama")
    env = {key: value for key, value in bare_env().items() if key != "JAX_PLATFORMS"}
    # HF_*_OFFLINE: lm-eval's datasets asks the hub before reading a local file, and this machine has no network
    return {**env, "HOME": str(folder), "START": str(folder), "JAX_PLATFORMS": "cpu", "WANDB_SILENT": "true",
            "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
            "PIP_CACHE_DIR": env.get("PIP_CACHE_DIR", str(Path.home() / ".cache" / "pip")),  # pip download: once
            # compiled programs kept as a user's are between commands, here between sections too
            "JAX_COMPILATION_CACHE_DIR": env.get("JAX_COMPILATION_CACHE_DIR", str(CACHE.parent / "jax")),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"}


def examples(text: str) -> list[tuple[str, str]]:
    """``[(command, printed), ...]``: the ``text`` blocks that show a command (``$ COMMAND``) and what it prints."""
    return re.findall(r"^```text\n\$ (.*?)\n(.*?)^```", text, flags=re.M | re.S)


SECTIONS = sections(README.read_text())
EXAMPLES = examples(README.read_text())


def test_every_skip_and_shortening_names_a_readme_command():
    used: set[str] = set()
    for blocks in SECTIONS.values():
        script(blocks, used)
    assert set(SKIP) | set(SHORTEN) <= used, f"no README command holds {sorted(set(SKIP) | set(SHORTEN) - used)}"


def test_the_readme_has_the_commands_a_user_needs():
    every = "\n".join(code for blocks in SECTIONS.values() for _, code in blocks)
    for needed in ("python -m theseus.run +experiment=gpt_small", "python -m pytest", "python -m theseus.sample",
                   "python -m theseus.run -m", "python -m theseus.export", "python -m theseus.evaluate"):
        assert needed in every
    assert "python -m theseus.run +experiment=gpt_small architecture.n_layer=8" in dict(EXAMPLES)


@pytest.mark.parametrize("command, printed", EXAMPLES)
def test_an_example_prints_what_the_readme_shows(command, printed, tmp_path):
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=project(tmp_path, needs_model=False),
                          capture_output=True, text=True, timeout=600)
    assert proc.stdout + proc.stderr == printed


@pytest.mark.parametrize("title", list(SECTIONS))
def test_readme_section_runs_as_written(title, tmp_path):
    body = script(SECTIONS[title], set())
    env = project(tmp_path, "/models/my-llama" in body)
    proc = subprocess.run(["bash", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1200)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"README section {title!r} failed:\n{output[-6000:]}"
    assert "Traceback" not in output, output[-6000:]
