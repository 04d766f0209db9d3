"""Plan -> what a serving engine needs: an argv list (printed as a command line) and scale files."""

from __future__ import annotations

import shlex

from ..errors import SensprofError
from ..plan import Plan, predicted_summary

FORMATS = ("vllm", "sglang", "llamacpp")
GIB = 2**30


def check_format(plan: Plan, fmt: str) -> None:
    if fmt not in FORMATS:
        raise SensprofError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if plan.target != fmt:
        raise SensprofError(
            f"this plan targets {plan.target!r}, which {fmt} cannot express; re-plan with "
            f"`sensprof plan PROFILE_DIR --target {fmt} ...`")


def memory_comments(plan: Plan, gpu_mem_gib: float, fit: bool = True) -> list[str]:
    """Bytes per token and, unless the engine's own pool arithmetic says it (vLLM), the tokens that fit."""
    s = predicted_summary(plan.layers)
    per_tok, bf16 = s["bytes_per_token"], s["bf16_bytes_per_token"]
    n, n_bf16 = int(gpu_mem_gib * GIB // per_tok), int(gpu_mem_gib * GIB // bf16)
    lines = [f"# KV cache: {per_tok:,.0f} bytes/token vs {bf16:,.0f} at bf16 ({bf16 / per_tok:.2f}x smaller, "
             f"{s['avg_bits']:.2f} bits/element)"]
    if fit:
        lines.append(f"# in {gpu_mem_gib:g} GiB of KV cache: {n:,} tokens vs {n_bf16:,} at bf16 (+{n - n_bf16:,})")
    lines.append(f"# predicted damage (sum of per-layer {plan.objective}): {plan.predicted['damage']:.3e}")
    return lines


def command_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
