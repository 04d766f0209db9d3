"""GPU benchmark of the packed-cache decode kernel and of end-to-end decoding; writes JSON and markdown.

1. Kernel: one decode step of attention over a 4-bit packed cache (contract.PackedRead: int4_c32 keys with
   int4_t32 values, the KIVI layout; q4_0 keys and values, llama.cpp's signed-max blocks without zero-points;
   vLLM's int4_per_token_head, one fp32 word of scale and zero-point per token and head, split in the kernel; the
   Triton kernel reads the packed codes, scales and zero-points) vs torch SDPA over the
   bf16 cache, at contexts 8K/32K/128K and batch 1/8/32, for a Llama-3-8B-like layer (32 query heads, 8 KV
   heads, head_dim 128). Reports time, bytes read, achieved bytes/s and the fraction of the GPU's peak
   bandwidth.
2. End to end: decode tokens/s of a randomly initialised smollm2-135m-shaped Llama (same speed as the real
   weights) with DynamicCache vs PlannedCache (4-bit plan, Triton kernels) and vs the formats of the shipped
   per-layer plan plans/smollm2-135m-sensprof-5bits.json, at contexts 1K/4K/8K, batch 1.

    python benchmarks/runtime_cuda.py --out benchmarks/results            # on a machine with an NVIDIA GPU
    TRITON_INTERPRET=1 python benchmarks/runtime_cuda.py --smoke --out /tmp/b   # tiny shapes, on the CPU
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

PER_LAYER_PLAN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plans",
                              "smollm2-135m-sensprof-5bits.json")
PEAK_BYTES_PER_S = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12}


def peak_bandwidth(name: str) -> float | None:
    return next((v for k, v in PEAK_BYTES_PER_S.items() if k in name), None)


def timed(fn, device, iters: int, warmup: int = 3) -> float:
    """Seconds per call (CUDA events on a GPU, wall clock elsewhere)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


LAYOUTS = ("int4_c32/int4_t32", "q4_0/q4_0", "int4_per_token_head")


def packed_cache(layout, b, hkv, t, d, device, gen):
    """Random 4-bit codes and fp16 scales in the runtime's layout (what PlannedCache stores, as the kernels read
    it: contract.PackedRead), without a float copy: {"k": ..., "v": ...}."""
    from sensprof.runtime.kernels.contract import PackedRead

    bits, group = 4, 32

    def codes():
        return torch.randint(0, 256, (bits, b, hkv, t, d // 8), dtype=torch.uint8, device=device, generator=gen)

    def half(*shape):
        return (torch.rand(*shape, device=device, generator=gen) * 0.1).half()

    table = torch.arange(2 ** bits, dtype=torch.float32, device=device)
    if layout == "q4_0/q4_0":  # per token over 32 channels, codes centred on 8, no zero-point
        def read():
            return PackedRead(codes=codes(), scale=half(b, hkv, t, d // group), zero=None, lut=table - 8, bits=bits,
                              token_group=1, channel_group=group, offset=8.0)

        return {"k": read(), "v": read()}
    if layout == "int4_per_token_head":  # vLLM's: one fp32 word per (token, head), the zero-point in its low 4 bits
        def word():
            scale = (torch.rand(b, hkv, t, 1, device=device, generator=gen) * 0.1 + 1e-3).view(torch.int32)
            zp = torch.randint(0, 16, (b, hkv, t, 1), device=device, generator=gen, dtype=torch.int32)
            return ((scale & -16) | zp).view(torch.float32)

        def read():
            return PackedRead(codes=codes(), scale=word(), zero=None, lut=table, bits=bits, token_group=1,
                              channel_group=d, offset=0.0, word=True)

        return {"k": read(), "v": read()}
    k = PackedRead(codes=codes(), scale=half(b, hkv, t // group, d), zero=half(b, hkv, t // group, d), lut=table,
                   bits=bits, token_group=group, channel_group=1, offset=0.0)
    v = PackedRead(codes=codes(), scale=half(b, hkv, t, d // group), zero=half(b, hkv, t, d // group), lut=table,
                   bits=bits, token_group=1, channel_group=group, offset=0.0)
    return {"k": k, "v": v}


def bytes_read(args: dict) -> int:
    return sum(x.numel() * x.element_size() for r in args.values() for x in (r.codes, r.scale, r.zero)
               if x is not None)


def time_packed(ops, reference, layout, b, hq, hkv, t, d, device, gen, iters) -> dict:
    args = packed_cache(layout, b, hkv, t, d, device, gen)
    # bf16 queries (tiles dequantized to bf16 for tl.dot) on the GPU; fp16 in the interpreter, whose tl.dot on
    # bf16 tiles is wrong (triton 3.x: numpy has no bf16)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float16
    q = torch.randn(b, hq, d, device=device, generator=gen).to(dtype)
    tail = torch.zeros(b, hkv, 0, d, device=device, dtype=dtype)
    kw = dict(k_tail=tail, v_tail=tail, scaling=d ** -0.5)
    row = {}
    if t * b <= 8192:  # correctness on the small shapes: the reference reads the same cache
        got = ops.decode_attention(q, **args, **kw)
        row["max_abs_err_vs_reference"] = float((got - reference.decode_attention(q, **args, **kw)).abs().max())
    sec = timed(lambda: ops.decode_attention(q, **args, **kw), device, iters)
    nbytes = bytes_read(args) + q.numel() * q.element_size()
    return {**row, "packed_ms": sec * 1e3, "packed_bytes": nbytes, "packed_bytes_per_s": nbytes / sec}


def time_sdpa(b, hq, hkv, t, d, device, gen, iters) -> dict:
    q = torch.randn(b, hq, 1, d, device=device, generator=gen, dtype=torch.bfloat16)
    k = torch.randn(b, hkv, t, d, device=device, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, hkv, t, d, device=device, dtype=torch.bfloat16, generator=gen)
    sec = timed(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True), device, iters)
    nbytes = 2 * k.numel() * k.element_size()
    return {"sdpa_ms": sec * 1e3, "sdpa_bytes": nbytes, "sdpa_bytes_per_s": nbytes / sec}


def kernel_rows(device, contexts, batches, hq, hkv, d, iters):
    from sensprof.runtime.kernels import reference, select

    ops = select("triton", device)
    gen = torch.Generator(device=device).manual_seed(0)
    rows = []
    for t in contexts:
        for b in batches:
            shape = {"context": t, "batch": b, "q_heads": hq, "kv_heads": hkv, "head_dim": d}
            try:
                sdpa = time_sdpa(b, hq, hkv, t, d, device, gen, iters)
            except torch.OutOfMemoryError as e:  # reported, not fatal
                sdpa = {"error": f"out of memory: {str(e).splitlines()[0][:80]}"}
            for layout in LAYOUTS:
                row = {**shape, "layout": layout}
                try:
                    row.update(time_packed(ops, reference, layout, b, hq, hkv, t, d, device, gen, iters))
                    row.update(sdpa)
                    if "error" not in row:
                        row["speedup"] = row["sdpa_ms"] / row["packed_ms"]
                except torch.OutOfMemoryError as e:
                    row["error"] = f"out of memory: {str(e).splitlines()[0][:80]}"
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def end_to_end_rows(device, contexts, steps, smoke):
    import transformers as tf
    from transformers import DynamicCache

    from sensprof.models import describe_layers, fingerprint
    from sensprof.artifacts import LayerPlan, Plan, load_plan
    from sensprof.runtime import PlannedCache
    from sensprof.runtime.generate import cache_kwarg

    if smoke:
        cfg = tf.LlamaConfig(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)
    else:  # smollm2-135m's shape
        cfg = tf.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                             num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=16384,
                             rope_theta=100000.0, tie_word_embeddings=True)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(cfg).to(device=device, dtype=dtype).eval()
    model.set_attn_implementation("sdpa")
    kw = cache_kwarg(model)

    def hand_plan(name, pairs):  # each layer's (K, V) schemes on these random weights
        return Plan.hand_made(name, fingerprint(model), [
            LayerPlan(i.index, i.kind, i.window, i.kv_heads, i.head_dim, k, v, 0.0, 0.0, {})
            for i, (k, v) in zip(describe_layers(model), pairs, strict=True)])

    plan = hand_plan("random smollm2-135m shape", [("int4_c32", "int4_t32")] * cfg.num_hidden_layers)
    caches = {"DynamicCache (bf16)": lambda: DynamicCache(config=model.config),
              "PlannedCache int4_c32/int4_t32 (Triton)": lambda: PlannedCache.from_plan(plan, model, kernels="triton")}
    if not smoke and os.path.exists(PER_LAYER_PLAN):  # the shipped per-layer plan's formats on the same weights
        mixed = hand_plan("random smollm2-135m shape, per-layer formats",
                          [(s.k_scheme, s.v_scheme) for s in load_plan(PER_LAYER_PLAN).layers])
        caches[f"PlannedCache {os.path.basename(PER_LAYER_PLAN)} formats (Triton)"] = \
            lambda: PlannedCache.from_plan(mixed, model, kernels="triton")
    rows = []
    for n in contexts:
        ids = torch.randint(3, cfg.vocab_size, (1, n), device=device, generator=torch.Generator(device).manual_seed(n))
        for name, make in caches.items():
            sec, cache = time_decode(model, kw, make(), ids, device, steps)
            row = {"cache": name, "context": n, "tokens_per_s": 1 / sec,
                   "packed_layer_steps": sum(getattr(x, "packed_steps", 0) for x in cache.layers)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


@torch.inference_mode()
def time_decode(model, kw, cache, ids, device, steps):
    """Seconds per greedy decode step after prefilling `ids` into `cache`."""
    state = {"next": model(ids, use_cache=True, **{kw: cache}).logits[:, -1:].argmax(-1)}

    def step():
        state["next"] = model(state["next"], use_cache=True, **{kw: cache}).logits[:, -1:].argmax(-1)

    return timed(step, device, steps, warmup=2), cache


def markdown(meta, kernel, e2e) -> str:
    lines = [f"# Packed-cache decode on {meta['device']} — {meta['date']}", "",
             f"Command: `{meta['command']}`; torch {meta['torch']}, triton {meta['triton']}, "
             f"transformers {meta['transformers']}. Peak bandwidth assumed {meta['peak_bytes_per_s'] or 'unknown'} B/s.",
             "", "## Decode-attention kernel (4-bit packed K / V) vs SDPA over the bf16 cache", "",
             "| context | batch | layout (K/V) | packed ms | packed GB/s | % peak | SDPA bf16 ms | SDPA GB/s | speed-up |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    peak = meta["peak_bytes_per_s"]
    for r in kernel:
        if "error" in r:
            lines.append(f"| {r['context']} | {r['batch']} | {r['layout']} | {r['error']} ||||||")
            continue
        pct = f"{100 * r['packed_bytes_per_s'] / peak:.0f}%" if peak else "n/a"
        lines.append(f"| {r['context']} | {r['batch']} | {r['layout']} | {r['packed_ms']:.3f} | "
                     f"{r['packed_bytes_per_s'] / 1e9:.0f} | "
                     f"{pct} | {r['sdpa_ms']:.3f} | {r['sdpa_bytes_per_s'] / 1e9:.0f} | {r['speedup']:.2f}x |")
    lines += ["", "## End-to-end decode, batch 1 (random weights, smollm2-135m shape)", "",
              "| cache | context | tokens/s | packed layer-steps |", "|---|---:|---:|---:|"]
    for r in e2e:
        lines.append(f"| {r['cache']} | {r['context']} | {r['tokens_per_s']:.1f} | {r['packed_layer_steps']} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results", help="directory for the JSON and markdown results")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (check the script on a CPU with TRITON_INTERPRET=1)")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    from sensprof.files import atomic_write_text

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type != "cuda" and not args.smoke:
        sys.exit("runtime_cuda.py: no CUDA device; run it on a GPU machine (or --smoke with TRITON_INTERPRET=1)")
    if args.smoke:
        contexts, batches, hq, hkv, d, e2e_ctx, iters, steps = [256], [1, 2], 4, 2, 32, [96], 1, 2
    else:
        contexts, batches, hq, hkv, d, e2e_ctx, iters, steps = [8192, 32768, 131072], [1, 8, 32], 32, 8, 128, \
            [1024, 4096, 8192], args.iters, 32
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu"
    import transformers
    import triton

    meta = {"device": name, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "triton": triton.__version__, "transformers": transformers.__version__,
            "peak_bytes_per_s": peak_bandwidth(name), "command": "python " + " ".join(sys.argv)}
    t0 = time.time()
    kernel = kernel_rows(device, contexts, batches, hq, hkv, d, iters)
    e2e = end_to_end_rows(device, e2e_ctx, steps, args.smoke)
    meta["seconds"] = time.time() - t0
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, f"{meta['date']}-{'smoke' if args.smoke else 'cuda'}-runtime")
    atomic_write_text(stem + ".json", json.dumps({"meta": meta, "kernel": kernel, "end_to_end": e2e}, indent=1))
    atomic_write_text(stem + ".md", markdown(meta, kernel, e2e))
    print(f"wrote {stem}.json and {stem}.md in {meta['seconds']:.0f} s")


if __name__ == "__main__":
    main()
