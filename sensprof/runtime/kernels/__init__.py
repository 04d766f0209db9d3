"""Kernels of the quantized-cache runtime.

Three backends, each a module satisfying contract.KernelBackend (every op the runtime calls, one signature
for all, and explicit capability flags): a pure-PyTorch reference (the test oracle), a Triton version for
GPUs and a compiled C version for CPUs (built on first use with the machine's C compiler).
`select(preference)` picks one: "reference", "triton", "cpu", or "auto" (Triton on a CUDA device, the
compiled kernels on the CPU; the reference, with one warning, where those cannot run). This package
imports without Triton and without a compiler.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

from ...errors import SensprofError
from . import reference
from .contract import KernelBackend, PackedRead, dense_read, split_word

PREFERENCES = ("auto", "triton", "cpu", "reference")
_warned: set = set()


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def _warn_once(message: str) -> None:
    if message not in _warned:
        warnings.warn(message, stacklevel=3)
        _warned.add(message)


def select(preference: str = "auto", device: str = "cpu") -> KernelBackend:
    """The backend to call: the module sensprof.runtime.kernels.reference, .triton_kernels or .cpu_kernels."""
    if preference not in PREFERENCES:
        raise SensprofError(f"unknown kernel preference {preference!r}; choose one of {', '.join(PREFERENCES)}")
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    on_gpu = str(device).startswith("cuda")
    if preference == "reference":
        return reference
    if preference == "cpu" or (preference == "auto" and not on_gpu and not interpret):
        return _cpu(preference, on_gpu)
    if not triton_available():
        if preference == "triton" and not on_gpu:
            raise SensprofError("the Triton kernels need triton installed (`pip install 'sensprof[kernels]'`)")
        _warn_once("triton is not installed: using the PyTorch reference kernels "
                   "(`pip install 'sensprof[kernels]'` for the fast path)")
        return reference
    if not on_gpu and not interpret:
        raise SensprofError("the Triton kernels need a CUDA device (or TRITON_INTERPRET=1 to run them on the CPU)")
    from . import triton_kernels

    return triton_kernels


def _cpu(preference: str, on_gpu: bool) -> KernelBackend:
    if on_gpu:
        raise SensprofError("the cpu kernels read CPU tensors; choose --kernels auto or triton for a CUDA model")
    from . import cpu_kernels

    why = cpu_kernels.available()
    if why is None:
        return cpu_kernels
    if preference == "cpu":
        raise SensprofError(f"the compiled CPU kernels cannot be used: {why}; install a C compiler, or choose "
                            "--kernels reference")
    _warn_once(f"the compiled CPU kernels cannot be used ({why}): using the slower PyTorch reference kernels")
    return reference


__all__ = ["PREFERENCES", "KernelBackend", "PackedRead", "dense_read", "select", "split_word", "triton_available"]
