"""Dump what llama.cpp stores in its KV cache: layer 0's K and V rows, as raw ggml blocks, for each cache type.

Run with the engine's Python (tools/engines/install.sh):
    ~/.cache/sensprof/engines/llamacpp/bin/python tools/llamacpp_golden/cache_rows.py GGUF TOKENS OUT.npz
TOKENS: comma-separated token ids. Layer 0's K and V depend only on the tokens, not on the cache type, so the f32
cache's rows are the input every quantized cache stored (tests/engines/test_llamacpp_cache.py compares sensprof's
emulation with the quantized rows). Read through llama.cpp's sequence state (llama_state_seq_get_data), whose
layout is src/llama-kv-cache.cpp state_write: a header, per cell its position and sequences, then per layer
the K type, row size and rows, then the same for V (flash attention: V not transposed). A model with sliding-window
layers has two caches, written base then SWA (src/llama-kv-cache-iswa.cpp state_write); the rows kept are the last
cache's first layer, model layer 0 for a model whose first layer slides (Gemma 3) as for a single-cache one."""

from __future__ import annotations

import ctypes
import struct
import sys

import numpy as np

TYPES = ("f32", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0")


def _rows(model: str, tokens: list[int], cache_type: str):
    import llama_cpp
    from llama_cpp import Llama

    t = int(getattr(llama_cpp, f"GGML_TYPE_{cache_type.upper()}"))
    n = len(tokens)
    llm = Llama(model_path=model, n_ctx=n, n_batch=n, n_ubatch=n, type_k=t, type_v=t, flash_attn=True,
                n_threads=2, verbose=False)
    try:
        llm.eval(tokens)
        ctx = llm._ctx.ctx
        size = llama_cpp.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
    finally:
        llm.close()
    b, off = bytes(buf), 8  # magic, version

    def read(fmt):
        nonlocal off
        v = struct.unpack_from(fmt, b, off)
        off += struct.calcsize(fmt)
        return v

    caches = []
    while off < len(b):
        n_stream, cells = read("<II")
        assert n_stream == 1 and cells == n, (n_stream, cells)
        for _ in range(cells):
            _, n_seq = read("<iI")
            read(f"<{n_seq}i")
        v_trans, n_layer = read("<II")
        assert not v_trans
        first = {}
        for tensor in "KV":
            for layer in range(n_layer):
                _, row = read("<iQ")
                if layer == 0:
                    first[tensor] = np.frombuffer(b, np.uint8, cells * row, off).reshape(cells, row).copy()
                off += cells * row
        caches.append(first)
    assert 1 <= len(caches) <= 2, len(caches)
    return caches[-1]


def main(model: str, tokens: str, out: str) -> int:
    ids = [int(t) for t in tokens.split(",")]
    arrays = {"tokens": np.asarray(ids)}
    for t in TYPES:
        for tensor, rows in _rows(model, ids, t).items():
            arrays[f"{t}.{tensor}"] = rows
    np.savez_compressed(out, **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
