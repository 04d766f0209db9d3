"""Draws of a machine's numerics: the same model, its every matmul input moved by a relative 1e-6 (seeded).

Two machines compute a float32 model a few ulps apart (another summation order, another BLAS kernel: an AMD CPU
without AMX against an Intel one with it), and a quantized cache turns those ulps into other rounding codes near a
boundary, whose effect a small model carries to the end. So one emulation run is one draw of a machine's numerics:
the same plan measured 2.6e-3 mean ΔNLL on one machine and 7.7e-3 on another, where the engine measured the same to
six digits. Realization 0 is the model as it is; realization r > 0 is another draw, the same one for the same call
sequence. The spread of a few draws is the noise any one measurement carries, an engine's included
(validate_engine.agreement counts it).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

DITHER = 1e-6


class Dither:
    """Seeded relative noise for realization r > 0 (r = 0: the identity)."""

    def __init__(self, realization: int):
        self.realization, self.calls = realization, 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self.realization:
            return x
        self.calls += 1
        g = torch.Generator().manual_seed(self.realization * 1_000_003 + self.calls)
        return x * (1 + DITHER * torch.randn(x.shape, generator=g, dtype=torch.float32).to(x.device, x.dtype))


@contextmanager
def float_numerics(model, realization: int = 0):
    """Within: `model`'s every linear layer multiplies its input as dithered by realization `realization`."""
    dither = Dither(realization)
    handles = []
    try:
        if realization:
            for module in model.modules():
                if isinstance(module, torch.nn.Linear):
                    handles.append(module.register_forward_pre_hook(lambda mod, args: (dither(args[0]), *args[1:])))
        yield
    finally:
        for h in handles:
            h.remove()
