"""TurboQuant's fixed tables: Lloyd-Max key codebook and the Hadamard rotation (vLLM 0.33).

The codebook is solved at runtime by vLLM, in Python floats, then cast to float32. To get the same
float32 centroids bit-for-bit we repeat that arithmetic in the same order (the solver only depends
on (head_dim, bits); results are cached). Facts cite paths relative to the vllm package.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch


def _trapz(f, a: float, b: float, n: int = 200) -> float:
    # quantization/turboquant/centroids.py::_trapz: 200-panel trapezoid, endpoints halved.
    h = (b - a) / n
    acc = 0.5 * (f(a) + f(b))
    for i in range(1, n):
        acc += f(a + i * h)
    return acc * h


@lru_cache(maxsize=32)
def lloyd_max(d: int, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(centroids, boundaries) float32 for N(0, 1/d) with 2**bits levels.

    centroids.py::solve_lloyd_max: start from 2**bits evenly spaced points in [-3.5s, 3.5s]
    (s = 1/sqrt(d)), iterate at most 200 times (stop when no centroid moved >= 1e-10); each
    cell's mean is trapz(x pdf)/trapz(pdf) over [edges], outer edges at +-10.5s.
    """
    n = 2**bits
    var = 1.0 / d
    s = math.sqrt(var)

    def pdf(x):
        return (1.0 / math.sqrt(2 * math.pi * var)) * math.exp(-x * x / (2 * var))

    def xpdf(x):
        return x * pdf(x)

    lo, hi = -3.5 * s, 3.5 * s
    c = [lo + (hi - lo) * (i + 0.5) / n for i in range(n)]
    for _ in range(200):
        edges = [lo * 3] + [(c[i] + c[i + 1]) / 2.0 for i in range(n - 1)] + [hi * 3]
        new = []
        for i in range(n):
            num = _trapz(xpdf, edges[i], edges[i + 1])
            den = _trapz(pdf, edges[i], edges[i + 1])
            new.append(num / den if den > 1e-15 else c[i])
        if max(abs(new[i] - c[i]) for i in range(n)) < 1e-10:
            break
        c = new
    b = [(c[i] + c[i + 1]) / 2.0 for i in range(n - 1)]
    return torch.tensor(c, dtype=torch.float32), torch.tensor(b, dtype=torch.float32)


def centroids(d: int, bits: int) -> torch.Tensor:
    """centroids.py::get_centroids (sorted ascending by construction)."""
    return lloyd_max(d, bits)[0]


def midpoints(d: int, bits: int) -> torch.Tensor:
    """backends/turboquant_attn.py::_ensure_on_device: (c_sorted[:-1] + c_sorted[1:]) / 2 in float32
    (not the float64 boundaries of the solver)."""
    c, _ = centroids(d, bits).sort()
    return (c[:-1] + c[1:]) / 2


@lru_cache(maxsize=8)
def hadamard(d: int) -> torch.Tensor:
    """backends/turboquant_attn.py::_build_hadamard_cached: Sylvester H / sqrt(d), float32.

    No random signs and no seed (TurboQuantConfig.seed is unused): one matrix for every layer and
    head. Symmetric and orthonormal, so it is its own inverse; vLLM uses it as both Pi and Pi^T.
    Only a power-of-two d gives a d x d matrix (otherwise the next power of two, and vLLM's
    `x_hat @ PiT` fails), so the MSE-key presets need a power-of-two head_dim.
    """
    h = torch.tensor([[1.0]])
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    if h.shape[0] != d:
        raise ValueError(f"TurboQuant MSE keys need a power-of-two head_dim, got {d}")
    return h / math.sqrt(d)
