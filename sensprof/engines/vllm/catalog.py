"""vLLM 0.33's KV-cache dtypes as data (no torch): the schemes that emulate each one's K and V, the GPUs that
run it, since when, and what vLLM does besides (boundary layers kept, queries transformed).

Facts are read from vLLM 0.33.0's source (paths relative to the vllm package); the emulation modules beside
this file hold the arithmetic, and tests/engines/ pins both with fixtures made by vLLM's own code.
A scheme name is the dtype's when K and V share one format, `<dtype>.K` / `<dtype>.V` when they differ, and
`<scheme>_qfp8` for the key side of a GPU whose attention also casts the query to fp8.
Imports nothing above the engines: the scheme registry (schemes.py) asks this catalog for vLLM's formats and
memory.py for their slot sizes, so the imports go one way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...errors import SensprofError
from . import facts

# The GPU generations of facts.GPUS, in the order --vllm-gpu lists them (the default first), with display names.
GPU_NAMES = {"hopper": "Hopper (sm90: H100/H200)", "ampere": "Ampere (sm80/86: A100/A10)",
             "blackwell": "Blackwell (sm100: B200/GB200)", "rocm": "ROCm (MI300/RDNA3)",
             "cpu": "vLLM's CPU backend (x86, AVX-512 or AMX for fp8)"}
assert set(GPU_NAMES) == set(facts.GPUS)


@dataclass(frozen=True)
class VllmDtype:
    """One --kv-cache-dtype value of vLLM 0.33 and the schemes that emulate it; where it runs, since when and
    what it stores come from facts.py."""

    name: str
    k_scheme: str
    v_scheme: str
    k_scheme_on: dict = field(default_factory=dict)  # gpu -> the key scheme there (query cast, fp8 variant)
    v_scheme_on: dict = field(default_factory=dict)  # gpu -> the value scheme there (the CPU's rounding)
    head_dims: str = "any"  # "any" | "pow2" | "256" | "nvfp4": what the kernels (and emulations) add to facts.py
    needs_scales: bool = False
    flag: str = ""  # the flag value when it differs from name (calibrated fp8 is still "fp8")
    checked: str = ""  # how the emulation is pinned (docs/planning.md's table)

    @property
    def flag_value(self) -> str:
        return self.flag or self.name

    @property
    def facts(self) -> facts.DtypeFacts:
        return facts.DTYPES[self.flag_value]

    @property
    def gpus(self) -> frozenset:
        return self.facts.gpus

    @property
    def boundary_skip(self) -> int:
        return 2 if facts.forces_boundary_skip(self.flag_value) else 0

    @property
    def since(self) -> str:
        return min_version_text(self.facts.since)

    def schemes_on(self, gpu: str) -> tuple[str, str]:
        return self.k_scheme_on.get(gpu, self.k_scheme), self.v_scheme_on.get(gpu, self.v_scheme)

    def head_dim_problem(self, head_dim: int, gpu: str) -> str | None:
        pow2 = head_dim >= 8 and head_dim & (head_dim - 1) == 0
        if self.head_dims == "pow2" and not pow2:
            return "needs a power-of-two head_dim"
        if self.head_dims == "256" and head_dim != 256:
            return "runs only with head_dim 256 (64 rotary dims)"
        if self.head_dims == "nvfp4" and head_dim == 64 and gpu != "blackwell":  # the sizes: facts.supports_head_dim
            return "FlashInfer takes head_dim 64 on Blackwell only (128/256/512 elsewhere)"
        if not facts.supports_head_dim(self.flag_value, head_dim):
            return f"vLLM does not take head_dim {head_dim} ({self.facts.head_dims})"
        return None


def min_version_text(since: str) -> str:
    """The release a flag value is gated at: long-standing ones at none, '<=0.20.0' at 0.20, and what could not
    be established at 0.33 (facts.py records why)."""
    if "long-standing" in since or "original" in since:
        return ""
    m = re.search(r"(\d+\.\d+)", since)
    return m.group(1) if m and "not established" not in since else "0.33"


_GOLD = "golden: vLLM's own {} on CPU"
# vLLM's CPU backend (csrc/cpu/cpu_attn_fp8.hpp): fp8 codes x * (1 / scale) rounded toward zero, the query read as it is
_CPU = "; on the CPU: golden (vLLM's own cpu_attn_reshape_and_cache, bit-exact) and checked against the running engine"
_PTH = "golden: vLLM's Triton write kernel under TRITON_INTERPRET=1"
_TQG = _GOLD.format("store/decode Triton kernels (interpreter)")
_OCT = _GOLD.format("PyTorch reference") + "; the HIP kernels are not in the wheel"
DTYPES: tuple[VllmDtype, ...] = (
    VllmDtype("fp8", "fp8_e4m3", "fp8_e4m3", {"hopper": "fp8_e4m3_qfp8", "cpu": "fp8_e4m3_rtz"},
              {"cpu": "fp8_e4m3_rtz"},
              checked="from source: saturating cast of x / scale; fp8 query cast on Hopper (FlashAttention 3)" + _CPU),
    VllmDtype("fp8_cal", "fp8_e4m3_cal", "fp8_e4m3_cal", {"hopper": "fp8_e4m3_cal_qfp8", "cpu": "fp8_e4m3_cal_rtz"},
              {"cpu": "fp8_e4m3_cal_rtz"}, flag="fp8",
              needs_scales=True,
              checked="as fp8, with per-layer k_scale/v_scale from --write-checkpoint" + _CPU),
    VllmDtype("fp8_e5m2", "fp8_e5m2", "fp8_e5m2", {"cpu": "fp8_e5m2_rtz"}, {"cpu": "fp8_e5m2_rtz"},
              checked="from source: saturating cast; no query cast" + _CPU),
    VllmDtype("fp8_per_token_head", "fp8_per_token_head", "fp8_per_token_head", checked=_PTH),
    VllmDtype("int8_per_token_head", "int8_per_token_head", "int8_per_token_head", checked=_PTH),
    VllmDtype("int4_per_token_head", "int4_per_token_head", "int4_per_token_head", head_dims="pow2",
              checked=_PTH + " (Hadamard rotation, hidden zero-point)"),
    VllmDtype("turboquant_k8v4", "turboquant_k8v4.K", "turboquant_k8v4.V", {"ampere": "turboquant_k8v4_e4b15.K"},
              checked=_TQG + "; fp8 key bytes from source (the interpreter's fp8 cast differs)"),
    VllmDtype("turboquant_4bit_nc", "turboquant_4bit_nc.K", "turboquant_4bit_nc.V", head_dims="pow2", checked=_TQG),
    VllmDtype("turboquant_k3v4_nc", "turboquant_k3v4_nc.K", "turboquant_k3v4_nc.V", head_dims="pow2", checked=_TQG),
    VllmDtype("turboquant_3bit_nc", "turboquant_3bit_nc.K", "turboquant_3bit_nc.V", head_dims="pow2", checked=_TQG),
    VllmDtype("ultraquant_4bit", "ultraquant_4bit.K", "ultraquant_4bit.V", head_dims="pow2",
              checked=_GOLD.format("store/dequant Triton kernels (interpreter)")),
    VllmDtype("nvfp4", "nvfp4", "nvfp4", {"blackwell": "nvfp4_qfp8"}, head_dims="nvfp4",
              checked="golden vs vLLM's ref_nvfp4_quant; the cache-write kernel is CUDA-only (from source)"),
    VllmDtype("nvfp4_4over6", "nvfp4_4over6", "nvfp4_4over6", {"blackwell": "nvfp4_4over6_qfp8"}, head_dims="nvfp4",
              checked="from source only (no vLLM code runs it on a CPU); tested against a per-block re-derivation"),
    VllmDtype("octave_k3v4", "octave_k3v4.K", "octave_k3v4.V", head_dims="256", checked=_OCT),
    VllmDtype("octave_k3v3", "octave_k3v3.K", "octave_k3v3.V", head_dims="256", checked=_OCT),
    VllmDtype("octave_k3v3_compact", "octave_k3v3_compact.K", "octave_k3v3_compact.V", head_dims="256", checked=_OCT),
)
# MLA-only dtypes (fp8_ds_mla, nvfp4_ds_mla) and fp8_inc (Intel Gaudi) do not apply to the models sensprof
# profiles (grouped-query attention); config/cache.py lists them too.
OTHER_DTYPES = {"fp8_ds_mla": "MLA models only", "nvfp4_ds_mla": "MLA models only", "fp8_inc": "Intel Gaudi only",
                "fp8_e4m3": "an alias of fp8", "auto/float16/bfloat16": "the model dtype"}
OCTAVE_ROPE_DIM = 64  # the only rotary size Octave's kernels take


def _dtype_of(scheme_name: str) -> tuple[str, str]:
    """(vLLM dtype, tensor) whose storage a scheme stands for."""
    base, _, tensor = scheme_name.partition(".")
    base = base.removesuffix("_qfp8").removesuffix("_e4b15")
    return base, tensor or "K"


def token_head_bytes(scheme_name: str, head_dim: int) -> float:
    """Bytes one token's K (or V) takes per KV head, as vLLM 0.33 allocates it; a shared slot's padding is the
    key's (facts.slot_bytes)."""
    dtype, tensor = _dtype_of(scheme_name)
    try:
        sb = facts.slot_bytes(dtype, head_dim, rope_dim=OCTAVE_ROPE_DIM if dtype.startswith("octave") else None)
    except (KeyError, ValueError) as e:
        raise SensprofError(f"scheme {scheme_name!r} cannot be stored by vLLM at head_dim {head_dim}: {e}") from None
    return sb.v if tensor == "V" else sb.k + sb.pad


def bits_per_element(scheme, head_dim: int) -> float:
    return token_head_bytes(scheme.name, head_dim) * 8 / head_dim


def _engine(name, emulation, tensor="", bits=4, query="", description=""):
    return dict(name=name, format="engine", bits=bits, codec="engine", granularity="token", group=None,
                scale_source="dynamic", scale_bits=0, emulation=emulation,
                tensor=tensor, query=query, description=description)


def engine_schemes() -> list[dict]:
    """The sensprof schemes of vLLM's own formats, as QuantScheme fields (schemes.py registers them). Plain fp8 and
    int8/fp8_per_token_head are sensprof's own codecs (schemes.py; the golden tests pin them to vLLM's write
    kernel), with a query cast where vLLM adds one: an entry with `like` is that registered scheme with these
    fields, its description followed by this one."""
    out = [
        _engine("int4_per_token_head", "vllm.int4_per_token_head",
                description="vLLM int4_per_token_head: Hadamard-rotated, asymmetric 4-bit per token and head"),
        _engine("nvfp4", "vllm.nvfp4", description="vLLM nvfp4: e2m1 with an e4m3 scale per 16 values"),
        _engine("nvfp4_4over6", "vllm.nvfp4_4over6",
                description="vLLM nvfp4_4over6: nvfp4 whose block scale is the better of max/6 and max/4"),
    ]
    for name in ("nvfp4", "nvfp4_4over6"):
        out.append(_engine(f"{name}_qfp8", f"vllm.{name}", "K", query="vllm.query_fp8",
                           description=f"vLLM {name} keys on Blackwell, where the query is cast to fp8 too"))
    for fp8 in ("fp8_e4m3", "fp8_e4m3_cal"):
        out.append(dict(like=fp8, name=f"{fp8}_qfp8", tensor="K", query="vllm.query_fp8",
                        description="query cast to fp8 e4m3 too (vLLM's FlashAttention 3 on Hopper)"))
    for fp8 in ("fp8_e4m3", "fp8_e4m3_cal", "fp8_e5m2"):  # csrc/cpu/cpu_attn_fp8.hpp: x * (1 / scale), truncated
        out.append(dict(like=fp8, name=f"{fp8}_rtz", rounding="toward_zero",
                        description="rounded toward zero, as vLLM's CPU backend writes its cache"))
    for preset, (kb, vb) in facts._TQ.items():
        key = "fp8 e4m3" if kb == 8 else f"{kb}-bit Lloyd-Max indices of the Hadamard-rotated unit key + fp16 norm"
        out.append(_engine(f"{preset}.K", f"vllm.{preset}", "K", kb, description=f"vLLM {preset} keys: {key}"))
        out.append(_engine(f"{preset}.V", f"vllm.{preset}", "V", vb,
                           description=f"vLLM {preset} values: {vb}-bit min/max per token and head, fp16 scale/zero"))
    out.append(_engine("turboquant_k8v4_e4b15.K", "vllm.turboquant_k8v4_e4b15", "K", 8,
                       description="vLLM turboquant_k8v4 keys before sm89 (Ampere): Triton fp8e4b15, saturates at 1.75"))
    out.append(_engine("ultraquant_4bit.K", "vllm.ultraquant_4bit", "K", query="vllm.ultraquant_4bit",
                       description="vLLM ultraquant_4bit keys: Hadamard-rotated 4-bit, UE8M0 scale per 32; fp8 query"))
    out.append(_engine("ultraquant_4bit.V", "vllm.ultraquant_4bit", "V",
                       description="vLLM ultraquant_4bit values: 4-bit, UE8M0 scale per 32"))
    for preset in ("octave_k3v4", "octave_k3v3", "octave_k3v3_compact"):
        for t in "KV":
            out.append(_engine(f"{preset}.{t}", f"vllm.{preset}", t, 3,
                               description=f"vLLM {preset} {'keys' if t == 'K' else 'values'}: rotated Lloyd-Max codes"))
    return out


def check_vllm_gpu(gpu: str) -> str:
    if gpu not in GPU_NAMES:
        raise SensprofError(f"unknown --vllm-gpu {gpu!r}; choose one of {', '.join(GPU_NAMES)}")
    return gpu


def get_dtype(name: str) -> VllmDtype:
    for d in DTYPES:
        if d.flag_value == name and not d.needs_scales:
            return d
    if name == "fp8_e4m3":
        return get_dtype("fp8")
    raise SensprofError(f"unknown vLLM KV dtype {name!r}; `sensprof schemes --target vllm` lists them")
