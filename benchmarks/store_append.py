"""Milliseconds per decode-step append to one layer's K and V stores at 1K / 4K / 8K tokens held.

One layer shape (3 KV heads x 64, bf16, batch 1), int4_c32 keys and int4_t32 values, the CPU kernels:
    python benchmarks/store_append.py [--steps N]
"""

from __future__ import annotations

import argparse
import time

import torch

from sensprof.runtime.store import TensorStore
from sensprof.schemes import get_scheme

HEADS, HEAD_DIM = 3, 64


def ms_per_append(held: int, steps: int) -> float:
    """Prefill `held` tokens, then time `steps` single-token appends to K and V (a decode step's writes)."""
    g = torch.Generator().manual_seed(0)
    k, v = TensorStore(get_scheme("int4_c32")), TensorStore(get_scheme("int4_t32"))
    x = torch.randn(1, HEADS, held + steps, HEAD_DIM, generator=g).to(torch.bfloat16)
    k.append(x[..., :held, :])
    v.append(x[..., :held, :])
    start = time.perf_counter()
    for t in range(held, held + steps):
        k.append(x[..., t:t + 1, :])
        v.append(x[..., t:t + 1, :])
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=512, help="appends timed at each length")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"# {HEADS} KV heads x {HEAD_DIM}, bf16, int4_c32 K / int4_t32 V; {args.steps} single-token appends, "
          "one thread")
    for held in (1024, 4096, 8192):
        print(f"{held:>5} tokens held: {ms_per_append(held, args.steps):.3f} ms per append (K + V)")


if __name__ == "__main__":
    main()
