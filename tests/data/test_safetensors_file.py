"""A safetensors file read as views of its memory map, against safetensors' own reader."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from theseus.config import ConfigError
from theseus.data.safetensors_file import SafetensorsFile, read_header, write_safetensors

TENSORS = {
    "f32": np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7,
    "f16": np.linspace(-2, 2, 10, dtype=np.float16),
    "bf16": np.linspace(-1, 3, 6).astype(ml_dtypes.bfloat16).reshape(3, 2),
    "i64": np.arange(-3, 3, dtype=np.int64),
    "u8": np.arange(5, dtype=np.uint8),
    "flags": np.array([True, False, True]),
    "scalar": np.array(2.5, np.float32),
    "empty": np.zeros((0, 4), np.float32),
}


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file(TENSORS, str(path), metadata={"format": "np"})
    return path


def test_every_tensor_reads_as_safetensors_reads_it(saved):
    f = SafetensorsFile(saved)
    assert set(f.tensors) == set(TENSORS)
    with safe_open(saved, "np") as reference:
        for name in TENSORS:
            tensor, expected = f.read(name), reference.get_tensor(name)
            assert tensor.dtype == expected.dtype and tensor.shape == expected.shape, name
            assert np.array_equal(tensor, expected), name


def test_a_tensor_is_a_read_only_view_of_the_file_not_a_copy(saved):
    tensor = SafetensorsFile(saved).read("f32")
    assert not tensor.flags.owndata and not tensor.flags.writeable
    with pytest.raises(ValueError):
        tensor[0, 0, 0] = 1


def test_the_spans_are_each_tensors_bytes_in_the_file(saved):
    data = saved.read_bytes()
    with saved.open("rb") as file:
        _, entries = read_header(file, saved)
    for name, entry in entries.items():
        assert data[entry.begin:entry.end] == np.ascontiguousarray(TENSORS[name]).tobytes(), name


@pytest.mark.parametrize(("damage", "reason"), [
    (lambda data: data[:-5], "ends past the file's end"),
    (lambda data: data[:6], "a header of"),
    (lambda data: data[:8] + b"{not json" + data[17:], "its header"),
    (lambda data: data.replace(b'"F32"', b'"Q99"', 1), "its header"),
])
def test_a_damaged_file_is_named_in_one_line(saved, damage, reason):
    saved.write_bytes(damage(saved.read_bytes()))
    with pytest.raises(ConfigError, match="is not a readable safetensors file") as caught:
        SafetensorsFile(saved)
    message = str(caught.value)
    assert str(saved) in message and reason in message and "\n" not in message


def test_a_tensor_the_file_lacks(saved):
    with pytest.raises(ConfigError, match="has no tensor 'missing'"):
        SafetensorsFile(saved).read("missing")


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_a_written_file_is_as_readable_as_the_umask_lets_files_be(tmp_path, umask, mode):
    """Not owner-only whatever the umask, as safetensors leaves its files: a shared folder's team reads it."""
    path = tmp_path / "model.safetensors"
    saved = os.umask(umask)
    try:
        write_safetensors(TENSORS, path)
    finally:
        os.umask(saved)
    assert path.stat().st_mode & 0o777 == mode
    with safe_open(path, "np") as f:
        assert f.metadata() == {"format": "pt"}
        assert all(np.array_equal(f.get_tensor(name), TENSORS[name]) for name in TENSORS)
