"""llama.cpp: one K cache type and one V cache type for all layers."""

from __future__ import annotations

from ..plan import Plan


def llamacpp_argv(plan: Plan, model_path: str) -> list[str]:
    k = plan.engine.get("cache_type_k", "f16")
    v = plan.engine.get("cache_type_v", "f16")
    argv = ["llama-server", "-m", model_path, "-ctk", k, "-ctv", v]
    if v != "f16":
        argv += ["-fa", "on"]  # a quantized V cache needs flash attention in llama.cpp
    return argv
