"""Memory budgets, all priced through memory.py's one storage formula (no torch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..constants import GIB
from ..errors import SensprofError
from ..memory import MODEL_BITS, bits_held_per_element, bits_per_element, layer_cache_bits, tokens_held
from ..schemes import QuantScheme



@dataclass(frozen=True)
class Budget:
    """kind: avg_bits (B), fraction (F of the 16-bit cache), or serving (GiB for S sequences of N tokens).

    `context_len`: price avg_bits / fraction as a cache of that many tokens holds them (full-precision sinks,
    residual windows and incomplete groups at 16 bits); None: the long-context average, where they are free."""

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
            if self.context_len:
                tokens = tokens_held(self.context_len, layer.get("kind"), layer.get("window"))
                return bits_held_per_element(scheme, tokens, layer["kv_heads"], layer["head_dim"]) * elems
            return bits_per_element(scheme, layer["head_dim"]) * elems
        tokens = tokens_held(self.max_model_len, layer.get("kind"), layer.get("window"))
        return self.max_num_seqs * layer_cache_bits(scheme, tokens, layer["kv_heads"], layer["head_dim"]) / 8

    def limit(self, layers: list[dict]) -> float:
        if self.kind == "serving":
            return self.value * GIB
        elems = sum(2 * layer["kv_heads"] * layer["head_dim"] for layer in layers)
        bits = self.value if self.kind == "avg_bits" else self.value * MODEL_BITS
        return bits * elems

    def describe(self, amount: float, layers: list[dict]) -> str:
        """An amount in this budget's unit, as the user would type it (rounded up, so it is feasible)."""
        if self.kind == "serving":
            return f"--gpu-mem-gib {_ceil4(amount / GIB):.4g}"
        elems = sum(2 * layer["kv_heads"] * layer["head_dim"] for layer in layers)
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
