"""Golden fixtures for vLLM 0.33's per-token-head KV dtypes and plain fp8.

Runs vLLM's OWN write kernels on CPU under the Triton interpreter:
``int4_per_token_head.reshape_and_cache_int4`` (its CPU RHT tier + ``_reshape_cache_int4_kernel``),
``triton_reshape_and_cache_flash.triton_reshape_and_cache_flash_per_token_head_quant`` (int8 / fp8) and
``triton_reshape_and_cache_flash.triton_reshape_and_cache_flash`` (plain fp8, e4m3 and e5m2), and vLLM's
``single_rht`` to rotate the int4 readback back. (The fp8 query, ``QuantFP8``, cannot be imported without
vLLM's full dependency set, e.g. xgrammar; its emulation is tested from source.)

The interpreter's fp32 -> fp8 cast (``triton.runtime.interpreter._convert_float``) is not what a GPU does (it
rounds ties up and mishandles mantissa carries and overflow); the script swaps it, for fp8 outputs only, for
torch's round-to-nearest-even cast with saturation to the largest finite value, which is what Triton emits on
sm89+ (``cvt.rn.satfinite.{e4m3,e5m2}x2.f32``). Everything else (scales, reciprocals, clamps, rounding,
packing) is vLLM's kernel code as interpreted.

Run (any venv with ``pip install --no-deps vllm==0.33.0`` plus torch, triton and the small pure-Python deps
vllm.config imports; on the sensprof dev box that is ``. /work/vllm_venv/bin/activate``), from the repo root:

    CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 python tools/vllm_golden/per_token_head.py

(``CUDA_VISIBLE_DEVICES=`` keeps vllm.triton_utils from disabling Triton on a machine with no GPU driver.)
Writes tests/data/vllm/per_token_head.pt and prints the int4 error comparison.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.runtime.interpreter as interp  # noqa: E402

_orig_convert = interp._convert_float
_FP8 = {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}


def _convert_float(data, src, dst, rounding_mode):
    if dst in _FP8 and src == tl.float32:
        x = torch.from_numpy(np.ascontiguousarray(data).view(np.float32).copy())
        fmax = torch.finfo(_FP8[dst]).max
        return x.clamp(-fmax, fmax).to(_FP8[dst]).view(torch.uint8).numpy().reshape(data.shape)
    return _orig_convert(data, src, dst, rounding_mode)


interp._convert_float = _convert_float

from vllm.v1.attention.ops import int4_per_token_head as i4  # noqa: E402
from vllm.v1.attention.ops import triton_reshape_and_cache_flash as rc  # noqa: E402
from vllm.v1.kv_cache_interface import KVQuantMode  # noqa: E402

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "vllm", "per_token_head.pt")
from golden_common import PTH_BLOCK as BLOCK  # noqa: E402
from golden_common import PTH_DIMS as DIMS  # noqa: E402
from golden_common import per_token_head_inputs as inputs  # noqa: E402
import golden_common  # noqa: E402


def int4_write(k, v):
    t, h, d = k.shape
    nb = -(-t // BLOCK)
    kc = torch.zeros(nb, BLOCK, h, d // 2, dtype=torch.uint8)
    vc = kc.clone()
    ks = torch.zeros(nb, BLOCK, h)
    vs = ks.clone()
    i4.reshape_and_cache_int4(k, v, kc, vc, torch.arange(t), k_scale_cache=ks, v_scale_cache=vs)
    return tuple(c.flatten(0, 1)[:t].clone() for c in (kc, ks, vc, vs))


def int4_readback(packed, scale_zp):
    """The read kernel's (code - zp) * (scale & ~0xF), rotated back with vLLM's single_rht and divided by b."""
    return golden_common.int4_readback(packed, scale_zp, i4.single_rht)


def pth_write(k, v, dtype, mode):
    t, h, d = k.shape
    kc = torch.zeros(1, BLOCK, h, d, dtype=dtype)
    vc = kc.clone()
    ks = torch.zeros(1, BLOCK, h)
    vs = ks.clone()
    rc.triton_reshape_and_cache_flash_per_token_head_quant(k, v, kc, vc, ks, vs, torch.arange(t), mode)
    return tuple(c[0, :t].clone() for c in (kc, ks, vc, vs))


def fp8_write(k, v, cache_dtype, k_scale, v_scale):
    """Plain fp8 through vLLM's Triton writer (TRITON_ATTN). The cache is allocated as uint8, as vLLM does
    (``STR_DTYPE_TO_TORCH_DTYPE``); the writer views it as ``current_platform.fp8_dtype()`` for every fp8
    cache dtype, so ``fp8_e5m2`` is stored with e4m3fn bits on this path. Returns the raw uint8 bytes."""
    t, h, d = k.shape
    kc = torch.zeros(1, BLOCK, h, d, dtype=torch.uint8)
    vc = kc.clone()
    rc._is_supported_kv_cache_dtype = lambda s: True  # the CPU platform reports no sm89
    torch.cuda.get_device_capability = lambda *a: (9, 0)  # only picks a tile size
    rc.triton_reshape_and_cache_flash(k, v, kc, vc, torch.arange(t), cache_dtype, torch.tensor(k_scale),
                                      torch.tensor(v_scale))
    return kc[0, :t].clone(), vc[0, :t].clone()


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def main():
    out = {"signs": {b: i4._get_rht_signs(b, 0, torch.device("cpu")).clone() for b in (32, 64, 128, 256)}}
    for i, d in enumerate(DIMS):
        k, v = inputs(d, 100 + i)
        case = {"k": k, "v": v}
        kc, ks, vc, vs = int4_write(k, v)
        case["int4"] = {"k_codes": kc, "k_scale": ks, "v_codes": vc, "v_scale": vs,
                        "k_read": int4_readback(kc, ks), "v_read": int4_readback(vc, vs)}
        for name, dt, mode in (("int8", torch.int8, KVQuantMode.INT8_PER_TOKEN_HEAD),
                               ("fp8", torch.float8_e4m3fn, KVQuantMode.FP8_PER_TOKEN_HEAD)):
            kc, ks, vc, vs = pth_write(k, v, dt, mode)
            case[name] = {"k_codes": kc, "k_scale": ks, "v_codes": vc, "v_scale": vs}
        if d != 96:
            for name, dt, scale in (("e4m3", "fp8_e4m3", 1.0), ("e4m3_s", "fp8_e4m3", 0.03),
                                    ("e5m2", "fp8_e5m2", 1.0), ("e5m2_s", "fp8_e5m2", 1e-3)):
                kc, vc = fp8_write(k, v, dt, scale, scale * 2)
                case[f"plain_{name}"] = {"k_codes": kc, "v_codes": vc, "k_scale": scale, "v_scale": scale * 2}
        out[d] = case
        print(f"d={d}: int4/int8/fp8 per-token-head" + ("" if d == 96 else " + plain fp8 e4m3/e5m2"))

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    torch.save(out, OUT)
    print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT)} bytes)")

    # Error of vLLM's int4 vs a naive symmetric +-7 per-token-head int4, on outlier keys (not saved).
    print("relative L2 error on keys with 3 x20 outlier channels (256 tokens x 4 heads):")
    for d in (64, 128, 256):
        k, v = inputs(d, 500 + d, t=256, h=4)
        kc, ks, vc, vs = int4_write(k, v)
        kf = k.float()
        amax = kf.abs().amax(-1, keepdim=True) / 7
        inv = torch.where(amax > 0, 1 / amax, torch.zeros_like(amax))
        naive = torch.where(kf >= 0, kf * inv + 0.5, kf * inv - 0.5).trunc().clamp(-7, 7) * amax
        print(f"  d={d}: vllm int4_per_token_head K {rel_l2(int4_readback(kc, ks), k):.4f}  "
              f"V {rel_l2(int4_readback(vc, vs), v):.4f}  |  naive symmetric int4 K {rel_l2(naive, k):.4f}")


if __name__ == "__main__":
    main()
