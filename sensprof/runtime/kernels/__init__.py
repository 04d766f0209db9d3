"""Kernels of the quantized-cache runtime: a pure-PyTorch reference for each op (the CPU path and the
test oracle). Device kernels will be overrides with the same signatures; this package imports without
Triton."""

from .reference import pack_bitplanes, unpack_bitplanes

__all__ = ["pack_bitplanes", "unpack_bitplanes"]
