"""Golden engine facts from vLLM 0.33.0's own classes -> tests/data/vllm/facts.json.

Recomputes, with vLLM code (no GPU): per-layer page sizes (KVCacheSpec.page_size_bytes after the
serving backend's customize_spec), TurboQuant boundary skip layers, the parse of
--kv-cache-dtype-skip-layers, the pool grouping of mixed-dtype / sliding-window models
(UniformTypeKVCacheSpecs, unify_kv_cache_spec_page_size, _get_kv_cache_groups_uniform_page_size),
and the SW skip-layer block choice (_largest_kernel_block_within).

Run in a venv with ``pip install --no-deps vllm==0.33.0`` plus torch (CPU), triton, pydantic and the
small pure-Python deps vLLM's config imports (on this machine: ``. /work/vllm_venv/bin/activate``):

    VLLM_TARGET_DEVICE=cpu python tools/vllm_golden/facts.py

Third-party modules that the install lacks (prometheus_client, xgrammar, flashinfer, fastapi, ...)
are replaced by empty stub modules; none of them is on the computed paths.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from types import SimpleNamespace

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "data", "vllm", "facts.json")
STUBS = {"prometheus_client", "xgrammar", "flashinfer", "fastapi", "llguidance", "outlines_core",
         "lm_format_enforcer", "partial_json_parser", "openai_harmony", "mistral_common", "gguf",
         "compressed_tensors", "depyf", "zmq", "ray", "cupy", "pynvml", "amdsmi", "aiter", "flydsl",
         "triton_kernels", "deep_gemm", "quack", "cutlass", "vllm_flash_attn"}


class _Meta(type):
    def __getattr__(cls, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return _Obj


class _Obj(metaclass=_Meta):
    """Stand-in for anything a stubbed module exports (class-like so ``A | B`` annotations work)."""

    def __init__(self, *a, **k):
        pass

    def __call__(self, *a, **k):
        return _Obj()

    def __getattr__(self, n):
        return _Obj()


class _StubModule(types.ModuleType):
    def __getattr__(self, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return _Obj


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STUBS:
            try:  # a real install wins
                if name not in sys.modules and importlib.machinery.PathFinder.find_spec(name.split(".")[0]):
                    return None
            except Exception:
                pass
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, m):
        pass


sys.meta_path.append(_Finder())

import torch  # noqa: E402
from dataclasses import replace  # noqa: E402

from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, SlidingWindowSpec, UniformTypeKVCacheSpecs, get_kv_quant_mode)
from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE  # noqa: E402
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend  # noqa: E402
from vllm.v1.attention.backends.turboquant_attn import TurboQuantAttentionBackend  # noqa: E402
from vllm.v1.attention.backends.flashinfer import FlashInferBackend  # noqa: E402
from vllm.v1.attention.ops.ultraquant.format import slot_size as uq_slot_size  # noqa: E402
from vllm.v1.attention.ops import rocm_octave  # noqa: E402
from vllm.model_executor.layers.quantization.turboquant.config import TurboQuantConfig  # noqa: E402
from vllm.v1.core import kv_cache_planning as kp  # noqa: E402
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

MODEL_DTYPE = torch.bfloat16
DTYPES = ["auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_per_token_head", "int8_per_token_head",
          "int4_per_token_head", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
          "turboquant_3bit_nc", "ultraquant_4bit", "nvfp4", "nvfp4_4over6", "octave_k3v4", "octave_k3v3",
          "octave_k3v3_compact"]
OCTAVE_ROPE = {256: 64}


def _customize(dt: str, spec):
    """The serving backend's customize_spec (UltraQuant's backend module needs FlyDSL/Triton symbols
    that fail to import on CPU; its customize_spec is exactly replace(spec, state_content_bytes=slot_size))."""
    if dt.startswith("turboquant_"):
        return TurboQuantAttentionBackend.customize_spec(spec)
    if dt.startswith("nvfp4"):
        return FlashInferBackend.customize_spec(spec)
    if dt == "ultraquant_4bit":
        return replace(spec, state_content_bytes=uq_slot_size(spec.head_size))
    if dt.startswith("octave_"):
        rocm_octave.register_rope_dim(spec.head_size, OCTAVE_ROPE[spec.head_size])
        try:
            from vllm.v1.attention.backends.rocm_octave_attn import RocmOctaveAttentionBackend
            return RocmOctaveAttentionBackend.customize_spec(spec)
        except ImportError:
            fmt = rocm_octave.OctaveFormat.from_cache_dtype(dt, spec.head_size, OCTAVE_ROPE[spec.head_size])
            return replace(spec, state_content_bytes=fmt.slot_bytes)
    return TritonAttentionBackend.customize_spec(spec)


def spec_for(dt: str, heads: int, hd: int, bs: int, window=None, cls=FullAttentionSpec, **kw):
    torch_dt = MODEL_DTYPE if dt == "auto" else STR_DTYPE_TO_TORCH_DTYPE[dt]
    extra = {"sliding_window": window} if window is not None else {}
    s = cls(block_size=bs, num_kv_heads=heads, head_size=hd, dtype=torch_dt,
            kv_quant_mode=get_kv_quant_mode(dt), **extra, **kw)
    return _customize(dt, s)


def pages():
    rows = []
    for dt in DTYPES:
        for hd in (64, 128, 256):
            if dt.startswith("octave_") and hd != 256:
                continue
            for heads in (1, 8):
                for bs in (1, 16):
                    rows.append({"dtype": dt, "kv_heads": heads, "head_dim": hd, "block_size": bs,
                                 "page_size_bytes": spec_for(dt, heads, hd, bs).page_size_bytes})
    return rows


def boundary():
    out = []
    for n_layers in (1, 2, 3, 4, 5, 28, 36, 61):
        mc = SimpleNamespace(is_hybrid=False, hf_text_config=SimpleNamespace(num_hidden_layers=n_layers))
        out.append({"num_hidden_layers": n_layers, "is_hybrid": False,
                    "skip": TurboQuantConfig.get_boundary_skip_layers(mc)})
    mc = SimpleNamespace(is_hybrid=True, hf_config=SimpleNamespace(),
                         hf_text_config=SimpleNamespace(num_hidden_layers=8, layer_types=[
                             "linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 +
                             ["full_attention"]))
    out.append({"num_hidden_layers": 8, "is_hybrid": True, "skip": TurboQuantConfig.get_boundary_skip_layers(mc)})
    return out


def parses():
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    p = EngineArgs.add_cli_args(FlexibleArgumentParser())
    act = next(a for a in p._actions if "--kv-cache-dtype-skip-layers" in a.option_strings)
    lines = [["--kv-cache-dtype", "int4_per_token_head", "--kv-cache-dtype-skip-layers", "0", "1", "29"],
             ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "sliding_window", "3"],
             ["--kv-cache-dtype", "fp8", "--kv-cache-dtype-skip-layers", "0,1"],
             ["--kv-cache-dtype-skip-layers", "0", "--kv-cache-dtype-skip-layers", "5"],
             ["--kv-cache-dtype", "turboquant_k3v4_nc"]]
    res = []
    for argv in lines:
        a = p.parse_args(argv)
        res.append({"argv": argv, "kv_cache_dtype": a.kv_cache_dtype,
                    "kv_cache_dtype_skip_layers": list(a.kv_cache_dtype_skip_layers)})
    return {"nargs": act.nargs, "default": list(act.default), "lines": res}


def sw_block(dt, heads, hd, budget):
    from vllm.model_executor.layers.attention.attention import _largest_kernel_block_within
    s = spec_for(dt, heads, hd, 1, window=128, cls=SlidingWindowSpec)
    return _largest_kernel_block_within(TritonAttentionBackend, s.real_page_size_bytes, budget, 16, s)


POOLS = [
    # name, primary, block_size (already aligned, as after Platform alignment), layers
    ("dense_int4_skip_0_1_29", "int4_per_token_head", 16,
     [("auto" if i in (0, 1, 29) else "int4_per_token_head", 8, 128, None) for i in range(32)]),
    ("dense_tq_k3v4_boundary", "turboquant_k3v4_nc", 80,
     [("auto" if i in (0, 1, 26, 27) else "turboquant_k3v4_nc", 8, 128, None) for i in range(28)]),
    ("dense_fp8", "fp8", 16, [("fp8", 4, 64, None) for _ in range(12)]),
    ("hybrid_fp8_5to1", "fp8", 16,
     [("fp8", 8, 128, None if i % 6 == 5 else 1024) for i in range(36)]),
    ("hybrid_fp8_skip_sw", "fp8", 32,
     [("fp8" if i % 6 == 5 else "auto", 8, 128, None if i % 6 == 5 else 1024) for i in range(36)]),
    ("hybrid_int8_skip_sw_and_0", "int8_per_token_head", 32,
     [("auto" if (i % 6 != 5 or i == 5) else "int8_per_token_head", 8, 128, None if i % 6 == 5 else 512)
      for i in range(24)]),
]


def pools():
    out = []
    for name, primary, bs, layers in POOLS:
        has_skip = any(l[0] == "auto" for l in layers) and primary != "auto"
        p_tok = spec_for(primary, layers[0][1], layers[0][2], 1).page_size_bytes
        s_tok = spec_for("auto", layers[0][1], layers[0][2], 1).page_size_bytes
        shared = bs * p_tok if has_skip and s_tok > p_tok else None
        specs = {}
        for i, (dt, h, hd, w) in enumerate(layers):
            name_i = f"model.layers.{i}.self_attn.attn"
            if w is None:
                specs[name_i] = spec_for(dt, h, hd, bs)
            else:
                per = spec_for(dt, h, hd, 1, window=w, cls=SlidingWindowSpec).real_page_size_bytes
                b = sw_block(dt, h, hd, shared or per * bs)
                s = spec_for(dt, h, hd, b, window=w, cls=SlidingWindowSpec)
                specs[name_i] = replace(s, page_size_padded=shared)
        uni = UniformTypeKVCacheSpecs.from_specs(specs)
        if kp.is_kv_cache_spec_uniform(specs):
            groups = kp._get_kv_cache_groups_uniform_spec(specs)
        elif uni is not None:
            groups = kp._get_kv_cache_groups_uniform_type(uni)
        else:
            groups = kp._get_kv_cache_groups_uniform_page_size(kp.unify_kv_cache_spec_page_size(specs))
        bpb = kp._get_kv_cache_bytes_per_block(groups, KVCacheLayout.LBHNC)
        gl = []
        for g in groups:
            layer_specs = [kp._get_per_layer_spec(g, n) for n in g.layer_names]
            gl.append({"kind": "sliding" if isinstance(layer_specs[0], SlidingWindowSpec) else "full",
                       "block_size": layer_specs[0].block_size, "n_layers": len(g.layer_names),
                       "layer_ids": sorted(int(n.split(".")[2]) for n in g.layer_names),
                       "page_bytes": sum(s.page_size_bytes for s in layer_specs)})
        out.append({"name": name, "primary": primary, "block_size": bs,
                    "layers": [list(l) for l in layers], "bytes_per_block": bpb, "groups": gl})
    return out


ALIGN = [("int4_per_token_head", 8, 128), ("turboquant_k3v4_nc", 8, 128), ("fp8", 8, 128),
         ("int8_per_token_head", 4, 64), ("turboquant_k8v4", 2, 256),
         ("turboquant_3bit_nc", 4, 128)]


def align():
    """Platform._align_heterogeneous_kv_block_size on a minimal config (skip layers present)."""
    from vllm.platforms.interface import Platform
    out = []
    for dt, heads, hd in ALIGN:
        for bs in (16, 32):
            mc = SimpleNamespace(get_num_kv_heads=lambda pc, h=heads: h, get_head_size=lambda d=hd: d,
                                 dtype=MODEL_DTYPE)
            cc = SimpleNamespace(cache_dtype=dt, kv_cache_dtype_skip_layers=["0"], block_size=bs,
                                 mamba_page_size_padded=None, skip_page_size_padded=None)
            vc = SimpleNamespace(cache_config=cc, model_config=mc, parallel_config=SimpleNamespace())
            backend = (TurboQuantAttentionBackend if dt.startswith("turboquant_") else
                       FlashInferBackend if dt.startswith("nvfp4") else TritonAttentionBackend)
            Platform._align_heterogeneous_kv_block_size(vc, backend)
            kernel = min(getattr(k, "base", k) for k in backend.get_supported_kernel_block_sizes())
            out.append({"dtype": dt, "kv_heads": heads, "head_dim": hd, "block_size_in": bs,
                        "smallest_kernel_block": kernel, "block_size": cc.block_size,
                        "skip_page_size_padded": cc.skip_page_size_padded})
    return out


def main():
    data = {"vllm_version": __import__("vllm").__version__, "model_dtype": "bfloat16",
            "pages": pages(), "boundary": boundary(), "parse": parses(), "pools": pools(), "align": align(),
            "sw_block": [{"dtype": dt, "kv_heads": 8, "head_dim": 128, "budget": b,
                          "block": sw_block(dt, 8, 128, b)} for dt, b in
                         [("auto", 32 * 1032), ("auto", 16 * 4096), ("int8_per_token_head", 32 * 2112),
                          ("fp8", 100000)]]}
    with open(OUT, "w") as f:
        json.dump(data, f, indent=1)
    print(f"wrote {OUT}: {len(data['pages'])} page rows, {len(data['pools'])} pools")


if __name__ == "__main__":
    main()
