"""What each serving engine can express, as data the planner and exporters share (no torch).

A target offers *options* for each tensor of each layer and constraints that tie them:
  sensprof  any profiled scheme per layer, K and V independent (sensprof's own runtime runs it)
  vllm      one global --kv-cache-dtype for K and V, plus a set of layers kept at the model dtype
  sglang    one global dtype for K and V, no skipping
  llamacpp  one K type and one V type for all layers (-ctk / -ctv)
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import SensprofError


@dataclass(frozen=True)
class EngineDtype:
    """One value of an engine's KV-cache flag, and the profiled scheme that reproduces it."""

    flag_value: str
    scheme: str
    needs_scales: bool = False  # calibrated: the engine must be given per-layer scales


@dataclass(frozen=True)
class Target:
    name: str
    structure: str  # "free" | "global_skip" | "global" | "global_kv"
    dtypes: tuple[EngineDtype, ...] = ()
    description: str = ""

    def available(self, profiled: set[str]) -> tuple[EngineDtype, ...]:
        return tuple(d for d in self.dtypes if d.scheme in profiled or d.scheme == "none")


# vLLM 0.33 spellings (vllm/config/cache.py); "fp8" is vLLM's alias of fp8_e4m3.
VLLM_DTYPES = (
    EngineDtype("fp8_e4m3", "fp8_e4m3"),
    EngineDtype("fp8_e4m3", "fp8_e4m3_cal", needs_scales=True),
    EngineDtype("fp8_e5m2", "fp8_e5m2"),
    EngineDtype("fp8_per_token_head", "fp8_per_token_head"),
    EngineDtype("int8_per_token_head", "int8_per_token_head"),
    EngineDtype("int4_per_token_head", "int4_per_token_head"),
)
SGLANG_DTYPES = (
    EngineDtype("auto", "none"),
    EngineDtype("fp8_e4m3", "fp8_e4m3"),
    EngineDtype("fp8_e4m3", "fp8_e4m3_cal", needs_scales=True),
    EngineDtype("fp8_e5m2", "fp8_e5m2"),
    EngineDtype("fp8_e5m2", "fp8_e5m2_cal", needs_scales=True),
)
LLAMACPP_TYPES = (
    EngineDtype("f16", "none"),
    EngineDtype("q8_0", "q8_0"),
    EngineDtype("q5_1", "q5_1"),
    EngineDtype("q5_0", "q5_0"),
    EngineDtype("q4_1", "q4_1"),
    EngineDtype("q4_0", "q4_0"),
)

TARGETS = {
    "sensprof": Target("sensprof", "free", description="any profiled scheme per layer, K and V independent"),
    "vllm": Target("vllm", "global_skip", VLLM_DTYPES,
                   "one --kv-cache-dtype for K and V, plus --kv-cache-dtype-skip-layers kept at the model dtype"),
    "sglang": Target("sglang", "global", SGLANG_DTYPES, "one --kv-cache-dtype for K and V, no skipping"),
    "llamacpp": Target("llamacpp", "global_kv", LLAMACPP_TYPES, "one K type (-ctk) and one V type (-ctv) for all layers"),
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise SensprofError(f"unknown target {name!r}; choose one of {', '.join(TARGETS)}") from None


def engine_dtype_for(target: Target, scheme: str) -> EngineDtype | None:
    for d in target.dtypes:
        if d.scheme == scheme:
            return d
    return None
