"""The checkpoint writer process (``trainer.checkpoint_writer=process``): its shared memory's
layout, a failed write reported by the loop's process, and a writer that dies with that process.
A run's saves, resumes, SIGTERM and kill -9 with it: tests/training/test_checkpoint.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from support import ROOT
from theseus.training.checkpoint import Checkpointer
from theseus.training.checkpoint_writer import ALIGN, layout, room_for_a_copy, views


def test_the_arrays_lie_apart_aligned_and_read_back_as_written():
    arrays = [np.arange(5, dtype=np.int32), np.ones((3, 7), ml_dtypes.bfloat16), np.float32(2.5) * np.ones(()),
              np.arange(12, dtype=np.float32).reshape(2, 2, 3)]
    places, size = layout(arrays)
    offsets = [offset for offset, _, _ in places]
    assert all(offset % ALIGN == 0 for offset in offsets) and offsets == sorted(offsets)
    assert all(b - a >= x.nbytes for a, b, x in zip(offsets, offsets[1:] + [size], arrays))
    memory = bytearray(size)
    for target, array in zip(views(memory, places), arrays, strict=True):
        np.copyto(target, array)
    for back, array in zip(views(memory, places), arrays, strict=True):
        assert back.dtype == array.dtype and back.shape == array.shape
        np.testing.assert_array_equal(back, array)


def test_the_state_is_copied_on_a_device_only_where_its_memory_holds_a_second_copy():
    leaves = [jnp.ones((256, 256), jnp.float32), jnp.ones(1024, jnp.bfloat16)]  # 262,144 + 2,048 bytes
    need = 256 * 256 * 4 + 1024 * 2

    def stats(free: int):
        return lambda device: {"bytes_limit": 10 * need, "peak_bytes_in_use": 10 * need - free}

    assert room_for_a_copy(leaves, stats(need)) and not room_for_a_copy(leaves, stats(need - 1))
    assert room_for_a_copy(leaves, lambda device: None)  # no statistics (a CPU): the host's memory


@pytest.mark.slow
def test_the_devices_copy_is_deleted_within_the_save_before_the_writer_starts(tmp_path):
    """The copy the save moves to the host, its buffers and the host copy JAX keeps on it, is
    deleted before the writer is sent the save (left for Python to free, on the chip it was freed
    beside the next steps, while the writer wrote); the checkpoint holds the state's values."""
    saver = Checkpointer(tmp_path / "checkpoints", writer="process")
    state = {"w": jnp.arange(1 << 16, dtype=jnp.float32), "b": jnp.ones(7, jnp.bfloat16)}
    saver.prepare(state)
    writer, made, deleted_when_sent = saver.writer, [], []
    copy, send = writer.copy, writer._send

    def copying(leaves):
        made.extend(copy(leaves))  # held here: only an explicit delete frees them
        return list(made)

    def sending(message):
        deleted_when_sent.append([array.is_deleted() for array in made])
        send(message)

    writer.copy, writer._send = copying, sending
    before = {id(array) for array in jax.live_arrays()}
    saver.save(3, state, {"position": 3}, {})
    assert writer.room and deleted_when_sent == [[True, True]]
    assert {id(array) for array in jax.live_arrays()} == before
    assert not any(array.is_deleted() for array in state.values())  # the copy's buffers were its own
    shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    restored = saver.restore(shapes, report=lambda line: None)[0]
    saver.close()
    np.testing.assert_array_equal(restored["w"], np.arange(1 << 16, dtype=np.float32))


@pytest.mark.slow
def test_a_save_the_dead_writer_cannot_take_is_reported_and_the_writer_still_closes(tmp_path):
    saver = Checkpointer(tmp_path / "checkpoints", writer="process")
    state = {"w": jnp.ones(1 << 16), "step": 3}  # a device array and a number
    saver.prepare(state)
    saver.writer.process.kill()
    saver.writer.process.wait()
    with pytest.raises(RuntimeError, match=r"writer process ended \(exit code -9\) before checkpoint 3 under ") as failed:
        saver.save(3, state, {"position": 3}, {})
    saver.close()  # while the error is held (as a handler holds it): its frames hold no view of the shared memory
    assert saver.writer.memory is None and saver.writer.process is None and failed.value


@pytest.mark.slow
def test_a_write_that_fails_is_reported_with_its_step(tmp_path):
    blocked = tmp_path / "file"  # a file where the checkpoints' folder should be
    blocked.write_text("")
    saver = Checkpointer(blocked / "checkpoints", writer="process")
    saver.save(3, {"w": jnp.ones(4)}, {"position": 3}, {})
    with pytest.raises(RuntimeError, match=r"checkpoint 3 under .*checkpoints could not be written: "):
        saver.wait()
    saver.close()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_the_writer_saves_in_order_and_dies_with_the_run(tmp_path):
    script = f"""
import os, signal, sys, jax.numpy as jnp
from pathlib import Path
from theseus.training.checkpoint import Checkpointer
saver = Checkpointer(Path({str(tmp_path / "checkpoints")!r}), keep=2, writer="process")
for step in (1, 2, 3):
    saver.save(step, {{"w": jnp.full(4, step, jnp.float32)}}, {{"position": step}}, {{}})
print(saver.steps(), saver.writer.process.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    kept, writer = proc.stdout.split("] ")
    assert kept == "[2, 3"  # keep=2
    deadline = time.monotonic() + 10
    while alive(int(writer)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(int(writer)), "the writer outlived the run's process"
    restored = Checkpointer(tmp_path / "checkpoints", writer="threads")
    state, data, _, step = restored.restore({"w": jnp.zeros(4, jnp.float32)})
    assert step == 3 and data == {"position": 3}
    np.testing.assert_array_equal(state["w"], np.full(4, 3, np.float32))
    restored.close()


@pytest.mark.slow
def test_ctrl_c_stops_the_run_with_a_checkpoint_the_writer_writes(tmp_path):
    """A terminal's Ctrl-C signals the run's whole process group: the run stops after its step with
    a checkpoint, which the writer (in a process group of its own) is still there to write."""
    cmd = [sys.executable, "-m", "theseus.run", "+experiment=gpt_tiny", "trainer.max_steps=200", "trainer.log_every=1",
           "trainer.eval_every=0", "trainer.checkpoint_every=3", "trainer.checkpoint_writer=process",
           "logger.mode=disabled", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"}, start_new_session=True)
    for line in proc.stdout:
        if line.startswith("step 5/"):
            os.killpg(proc.pid, signal.SIGINT)  # as the terminal does
            break
    output = proc.stdout.read()
    assert proc.wait(timeout=300) == 128 + signal.SIGINT, output[-3000:]
    stopped = max(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir() if p.name.isdigit())
    assert stopped >= 5 and f"checkpoint {stopped} saved" in output
