"""A compile that runs out of device memory is read from each backend's real words, and becomes
one line, ``does not fit: needs X, has Y``; a real TPU compile too big for its chip shows it."""

from __future__ import annotations

import importlib.util

import pytest

from theseus.base.compile_oom import ADVICE, OutOfMemory, out_of_memory, oom_verdict
from theseus.config import ConfigError

G, M = 2**30, 2**20
# the texts as the backends raised them (JaxRuntimeError's message)
LIBTPU_0_0_42 = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
                 "(80.01G) exceeds available HBM (15.75G).")
LIBTPU_0_0_52 = ("RESOURCE_EXHAUSTED: E1000: CompileTimeHbmOom: Ran out of memory on HBM, the total memory required "
                 "for HLO temporaries (32.68G) exceeds available HBM (15.75G). HLO module: jit_train_step.\n"
                 "See https://openxla.org/xla/errors/error_1000 for more details.")
OLDER_LIBTPU = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used 21.95G "
                "of 15.48G hbm.\n Exceeded hbm capacity by 6.47G.\n\nTotal hbm usage >= 22.47G:\n    reserved        "
                "530.00M\n    program          21.95G\n    arguments            0B\n")
XLA_GPU = ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 4770354232 bytes.\nBufferAssignment OOM "
           "Debugging.\nBufferAssignment stats:\n             parameter allocation:  372.76MiB\n              constant "
           "allocation:    48.5KiB\n        maybe_live_out allocation:    9.64GiB\n     preallocated temp allocation:    "
           "4.44GiB\n                 total allocation:   14.44GiB\n              total fragmentation:  680.30MiB (4.60%)\n")


@pytest.mark.parametrize("text, expected", [
    (LIBTPU_0_0_42, OutOfMemory(round(80.01 * G), round(15.75 * G), "HBM")),
    (LIBTPU_0_0_52, OutOfMemory(round(32.68 * G), round(15.75 * G), "HBM")),
    (OLDER_LIBTPU, OutOfMemory(round(21.95 * G), round(15.48 * G), "HBM")),
    (XLA_GPU, OutOfMemory(round(14.44 * G), None, "device memory")),
    ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 6291456 bytes.", OutOfMemory(6 * M, None, "device memory")),
    ("RESOURCE_EXHAUSTED: Out of memory allocating 29613842628 bytes.", OutOfMemory(29613842628, None, "device memory")),
])
def test_each_backends_words_give_what_was_needed_and_what_the_device_has(text, expected):
    assert out_of_memory(RuntimeError(text)) == expected


@pytest.mark.parametrize("text", ["INVALID_ARGUMENT: Ran out of memory on HBM", "RESOURCE_EXHAUSTED: too many open files",
                                  "the total memory required for HLO temporaries (80.01G) exceeds available HBM (15.75G)"])
def test_other_errors_are_no_verdict(text):
    assert out_of_memory(ValueError(text)) is None


def test_the_verdict_is_one_line_naming_both_sizes_and_the_advice():
    with pytest.raises(ConfigError) as info, oom_verdict("mesh.target=tpu:v5e-8: the train step"):
        raise RuntimeError(LIBTPU_0_0_52)
    assert str(info.value) == ("mesh.target=tpu:v5e-8: the train step does not fit: needs 32.68 GiB of HBM per device, "
                               f"has 15.75 GiB: {ADVICE}")
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_a_backend_that_does_not_say_what_the_device_has_is_told_it():
    with pytest.raises(ConfigError, match=r"^the step does not fit: needs 14.44 GiB of device memory per device, "
                                          r"has 80 GiB: use fewer$"), oom_verdict("the step", 80 * G, "use fewer"):
        raise RuntimeError(XLA_GPU)


def test_any_other_error_passes_unchanged():
    error = RuntimeError("INTERNAL: something else")
    with pytest.raises(RuntimeError) as info, oom_verdict("the step"):
        raise error
    assert info.value is error


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu (the plan extra) compiles for a TPU")
def test_a_real_tpu_compile_too_big_for_the_chip_is_a_verdict():
    """40 GiB of float32 (argument and result) on one v5e chip (16 GiB of HBM), compiled by libtpu."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from theseus.plan.target import target_named

    device = target_named("tpu:v5e-8").devices[0]
    x = jax.ShapeDtypeStruct((20 * G // 4,), jnp.float32, sharding=SingleDeviceSharding(device))
    with pytest.raises(ConfigError, match=r"^tpu:v5e-8 does not fit: needs 40 GiB of HBM per device, has 15.75 GiB: "):
        with oom_verdict("tpu:v5e-8"):
            jax.jit(lambda a: a * 2 + 1).lower(x).compile()
