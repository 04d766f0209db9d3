"""Golden fixtures for vLLM 0.33's Octave KV dtypes (octave_k3v4, octave_k3v3, octave_k3v3_compact).

Calls vLLM's own PyTorch reference of the format, ``vllm.v1.attention.ops.rocm_octave``
(``reference_quantize`` / ``reference_dequantize`` / ``reference_attention``), on CPU. The runtime
store and attention are HIP custom ops (``torch.ops._C.octave_cache_store`` / ``octave_decode``)
that exist only in a ROCm build, so they cannot be run here.

Run (any venv with ``pip install --no-deps vllm==0.33.0`` plus torch and the small pure-Python deps
vllm.config imports; on the sensprof dev box that is ``. /work/vllm_venv/bin/activate``), from the repo root:

    python tools/vllm_golden/octave.py

Writes tests/data/vllm/octave.pt.
"""

import os

import torch

from vllm.v1.attention.ops import rocm_octave as ro

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "vllm", "octave.pt")
PRESETS = ("octave_k3v4", "octave_k3v3", "octave_k3v3_compact")
# (head_dim, rope_dim): 256/64 is what the ROCm kernels run; the rest exercise the format code.
SHAPES = ((64, 64), (128, 64), (128, 0), (256, 64))
T, H = 5, 2


def inputs(d: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(T, H, d, generator=g)
    k[..., torch.randperm(d, generator=g)[:3]] *= 20.0  # outlier channels
    v = torch.randn(T, H, d, generator=g)
    k[1, 0] = 0.0  # zero vectors take the scale == 0 branch
    v[2, 1] = 0.0
    k[3, 1] *= 1e-3  # small blocks: the LUT_ONE fixed point keeps fp16 scales normal
    v[4, 0] *= 1e-3
    # the model's cached K/V are bf16
    return k.bfloat16().float(), v.bfloat16().float()


def main():
    cases = []
    for i, (d, r) in enumerate(SHAPES):
        k, v = inputs(d, 1000 + i)
        k16, v16 = k.bfloat16(), v.bfloat16()  # exact (inputs are bf16 values); halves the file
        for p in PRESETS:
            try:
                fmt = ro.OctaveFormat.from_cache_dtype(p, d, r)
            except ValueError as e:
                print("skip", p, d, r, e)
                continue
            if r == 0 and fmt.compact:  # compact K ignores rope_dim: same as the rope=64 case
                continue
            slots = ro.reference_quantize(k, v, fmt)
            kd, vd = ro.reference_dequantize(slots, fmt)
            case = dict(preset=p, head_dim=d, rope_dim=r, slot_bytes=fmt.slot_bytes, k=k16, v=v16,
                        slots=slots, k_deq=kd, v_deq=vd)
            if d == 256 and p == "octave_k3v4":  # the rotated read (what the kernels consume), for the kernel shape only
                case["k_rot"], case["v_rot"] = ro.reference_dequantize(slots, fmt, rotated=True)
            cases.append(case)
            print(f"{p:22s} d={d:3d} rope={r:3d} slot={fmt.slot_bytes}B")
    # attention read path (decode): reference_attention over a one-block paged cache, head_dim 256.
    attn = []
    g = torch.Generator().manual_seed(7)
    k = torch.randn(5, 2, 256, generator=g)
    k[..., 17] *= 20.0
    k = k.bfloat16().float()
    v = torch.randn(5, 2, 256, generator=g).bfloat16().float()
    q = torch.randn(3, 4, 256, generator=g).bfloat16().float()
    for p in PRESETS:
        fmt = ro.OctaveFormat.from_cache_dtype(p, 256, 64)
        cache = torch.zeros(1, 2, 16, fmt.slot_bytes, dtype=torch.uint8)
        cache[0, :, :5] = ro.reference_quantize(k, v, fmt).transpose(0, 1)
        out = ro.reference_attention(q, cache, torch.zeros(1, 1, dtype=torch.int32),
                                     torch.zeros(3, dtype=torch.int32), torch.tensor([3, 4, 5]), fmt, 1 / 16)
        attn.append(dict(preset=p, out=out))
    signs = {n: ro.signs(n, "cpu") for n in (64, 128, 256)}
    attn_in = dict(k=k.bfloat16(), v=v.bfloat16(), q=q.bfloat16(), klen=[3, 4, 5], scale=1 / 16)
    torch.save(dict(cases=cases, attention=attn, attention_inputs=attn_in, signs=signs), OUT)
    print("wrote", os.path.normpath(OUT), os.path.getsize(OUT), "bytes")


if __name__ == "__main__":
    main()
