"""Helpers shared by tests (importable as ``support``: tests/ is on the path)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def run_python(*args: str, devices: int | None = None, env: dict | None = None, timeout: int = 600,
               cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``python ARGS`` in a fresh process (optionally with N simulated CPU devices)."""
    full_env = {**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})}
    if devices:
        full_env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=cwd or ROOT)
