"""Small corpora in tmp_path, and DataConfigs whose cache lives there too."""

from __future__ import annotations

from pathlib import Path

import pytest

from theseus.data.config import DataConfig

TEXTS = {
    "a.txt": "First line of a.\nSecond: naïve café, 日本語, ✓.\n",
    "sub/b.md": "# b\n\ndef f(x):\n    return x * 2  # twice\n" * 20,
    "sub/c.py": "print('c')\n",
}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A folder of TEXTS (plus a hidden file, which is not part of the corpus)."""
    root = tmp_path / "corpus"
    for name, text in TEXTS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    (root / ".hidden").write_text("not corpus")
    return root


@pytest.fixture
def config(tmp_path: Path):
    """``config(**overrides)``: a DataConfig with its cache under tmp_path."""

    def make(**overrides) -> DataConfig:
        return DataConfig(**{"cache_dir": str(tmp_path / "cache"), **overrides})

    return make

