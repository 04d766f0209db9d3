"""Kernels of the quantized-cache runtime.

Each op has a pure-PyTorch reference (the CPU path and the test oracle) and a Triton version with the
same signature. `select(preference)` picks one: "reference", "triton", or "auto" (Triton on a CUDA
device when Triton is installed, else the reference). This package imports without Triton.
"""

from __future__ import annotations

import importlib.util
import os
import warnings

from ...errors import SensprofError
from . import reference
from .reference import pack_bitplanes, unpack_bitplanes

PREFERENCES = ("auto", "triton", "reference")
_warned = False


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def select(preference: str = "auto", device: str = "cpu"):
    """The module whose functions to call: sensprof.runtime.kernels.reference or .triton_kernels."""
    global _warned
    if preference not in PREFERENCES:
        raise SensprofError(f"unknown kernel preference {preference!r}; choose one of {', '.join(PREFERENCES)}")
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    on_gpu = str(device).startswith("cuda")
    if preference == "reference" or (preference == "auto" and not on_gpu and not interpret):
        return reference
    if not triton_available():
        if preference == "triton" and not on_gpu:
            raise SensprofError("the Triton kernels need triton installed (`pip install 'sensprof[kernels]'`)")
        if not _warned:
            warnings.warn("triton is not installed: using the PyTorch reference kernels "
                          "(`pip install 'sensprof[kernels]'` for the fast path)", stacklevel=2)
            _warned = True
        return reference
    if not on_gpu and not interpret:
        raise SensprofError("the Triton kernels need a CUDA device (or TRITON_INTERPRET=1 to run them on the CPU)")
    from . import triton_kernels

    return triton_kernels


__all__ = ["PREFERENCES", "pack_bitplanes", "select", "triton_available", "unpack_bitplanes"]
