"""Choosing a backend: preferences, devices, and the fallback to the reference when Triton is missing."""

import warnings

import pytest

from sensprof.errors import SensprofError
from sensprof.runtime import kernels
from sensprof.runtime.kernels import cpu_kernels, reference, select


def test_kernel_selection():
    assert select("reference") is reference
    assert select("auto", "cpu") is (cpu_kernels if cpu_kernels.available() is None else reference)
    with pytest.raises(SensprofError):
        select("fastest")
    with pytest.raises(SensprofError, match="read CPU tensors"):
        select("cpu", "cuda:0")


def test_triton_absent_on_a_gpu_falls_back_to_the_reference_with_one_warning(monkeypatch):
    monkeypatch.setattr(kernels, "triton_available", lambda: False)
    monkeypatch.setattr(kernels, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kernels.select("auto", "cuda") is reference
        assert kernels.select("triton", "cuda:0") is reference
        assert kernels.select("auto", "cuda") is reference
    msgs = [str(w.message) for w in caught]
    assert len(msgs) == 1 and "triton is not installed" in msgs[0] and "sensprof[kernels]" in msgs[0]
    with pytest.raises(SensprofError, match="need triton installed"):
        kernels.select("triton", "cpu")  # asked for on the CPU without the interpreter: an error, not a fallback
