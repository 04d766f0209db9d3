"""How the Triton packed decode kernel's launch shape moves its speed on a GPU: tokens per tile, programs aimed for,
warps and pipeline stages (triton_kernels.DECODE_TUNING), for two 4-bit layouts at a few contexts x batches of a
Llama-3-8B-like layer (32 query heads, 8 KV heads, head_dim 128). Every configuration is first checked against the
PyTorch reference on the same cache; prints one JSON row per (shape, layout, configuration) and writes them all.

    python benchmarks/decode_kernel_sweep.py --out sweep.json                        # on a GPU
    TRITON_INTERPRET=1 python benchmarks/decode_kernel_sweep.py --smoke --out /tmp/s.json   # the script, on a CPU
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from runtime_cuda import bytes_read, packed_cache, peak_bandwidth, timed  # noqa: E402

LAYOUTS = ("int4_c32/int4_t32", "q4_0/q4_0")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop starting new shapes after this long")
    args = ap.parse_args()
    from sensprof.runtime.kernels import reference, triton_kernels

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.smoke:
        shapes, hq, hkv, d, iters = [(256, 2)], 4, 2, 32, 1
        grid = {"block_t": [32, 64], "programs": [1024], "num_warps": [None], "num_stages": [None]}
    else:
        shapes, hq, hkv, d, iters = [(2048, 4), (32768, 8), (131072, 1), (8192, 32)], 32, 8, 128, args.iters
        grid = {"block_t": [32, 64, 128], "programs": [1024, 8192], "num_warps": [4, 8], "num_stages": [None]}
    default = dict(triton_kernels.DECODE_TUNING)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    gen = torch.Generator(device=device).manual_seed(0)
    peak = peak_bandwidth(torch.cuda.get_device_name(0)) if device.type == "cuda" else None
    rows, t0 = [], time.time()
    for t, b in shapes:
        if time.time() - t0 > args.budget_s:
            print(json.dumps({"skipped_shape": [t, b], "reason": "budget"}), flush=True)
            continue
        for layout in LAYOUTS:
            cache = packed_cache(layout, b, hkv, t, d, device, gen)
            q = torch.randn(b, hq, d, device=device, generator=gen).to(dtype)
            tail = torch.zeros(b, hkv, 0, d, device=device, dtype=dtype)
            kw = dict(k_tail=tail, v_tail=tail, scaling=d ** -0.5)
            want = reference.decode_attention(q, **cache, **kw) if t * b <= 65536 else None
            nbytes = bytes_read(cache) + q.numel() * q.element_size()
            for values in itertools.product(*grid.values()):
                config = dict(zip(grid, values))
                triton_kernels.DECODE_TUNING.update(default, **config)
                row = {"context": t, "batch": b, "layout": layout, **config}
                try:
                    got = triton_kernels.decode_attention(q, **cache, **kw)
                    if want is not None:
                        row["max_abs_err"] = float((got.float() - want.float()).abs().max())
                    sec = timed(functools.partial(triton_kernels.decode_attention, q, **cache, **kw), device, iters)
                    row.update(ms=sec * 1e3, gb_per_s=nbytes / sec / 1e9)
                    if peak:
                        row["pct_peak"] = 100 * nbytes / sec / peak
                except Exception as e:  # a configuration the compiler refuses (registers, shared memory)
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                rows.append(row)
                print(json.dumps(row), flush=True)
            del cache
            if device.type == "cuda":
                torch.cuda.empty_cache()
    triton_kernels.DECODE_TUNING.update(default)
    meta = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu (interpreter)",
            "torch": torch.__version__, "default": default, "seconds": time.time() - t0}
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    os.replace(tmp, args.out)
    best = {}
    for r in rows:
        key = (r["context"], r["batch"], r["layout"])
        if "ms" in r and (key not in best or r["ms"] < best[key]["ms"]):
            best[key] = r
    for key, r in best.items():
        base = next((x for x in rows if (x["context"], x["batch"], x["layout"]) == key and "ms" in x
                     and x["block_t"] == default["block_t"] and x["programs"] == default["programs"]
                     and x["num_warps"] in (None, 4)), None)  # Triton's default is 4 warps
        print(f"best {key}: {r['ms']:.3f} ms ({r.get('gb_per_s', 0):.0f} GB/s) with "
              f"{ {k: r[k] for k in grid} }" + (f"; default-like {base['ms']:.3f} ms" if base else ""))


if __name__ == "__main__":
    main()
