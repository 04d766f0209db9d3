"""Plan -> what a serving engine needs: an argv list (printed as a command line) and scale files.

Each format is one module with the same three functions, registered in FORMATS:
`check(plan, opts, name)` refuses what it cannot express before any weights load, `needs_weights(opts)` says
whether it needs the model loaded, and `command(plan, opts, loaded, name, model_path)` returns the argv, the
comment lines and whether the generic tokens-that-fit line applies.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass

from ..artifacts import Plan, predicted_summary, serving_line
from ..constants import GIB
from ..errors import SensprofError
from . import llamacpp, sglang, vllm

FORMATS = {"vllm": vllm, "sglang": sglang, "llamacpp": llamacpp}


MIN_GIB, MAX_GIB = 2 ** -10, 2.0 ** 30  # 1 MiB to 1 EiB: outside, "0 tokens fit" or an overflow, never a figure


@dataclass(frozen=True)
class ExportOptions:
    format: str
    model: str | None = None  # the model to serve and check the plan against (default: the plan's)
    gpu_mem_gib: float = 80.0  # KV-cache memory for the tokens-that-fit comment (MIN_GIB to MAX_GIB)
    vllm_version: str = vllm.DEFAULT_VERSION
    vllm_gpu: str | None = None
    hub_id: str | None = None  # vllm, GGUF model: the hub repository it was converted from
    write_checkpoint: str | None = None  # vllm: a bf16 copy with calibrated k/v scales
    scales_out: str | None = None  # sglang: the --quantization-param-path JSON
    tp: int = 1  # sglang: tensor-parallel size

    def check(self) -> None:
        """Refuse options that belong to another format, before anything is loaded or written."""
        from ..files import check_writable
        from .checkpoint import check_checkpoint_dir

        if self.format not in FORMATS:
            raise SensprofError(f"unknown --format {self.format!r}; choose one of {', '.join(FORMATS)}")
        if self.gpu_mem_gib is not None and not 0 < self.gpu_mem_gib < float("inf"):
            raise SensprofError(f"--gpu-mem-gib must be positive and finite, got {self.gpu_mem_gib:g}; pass the GiB "
                                "of KV cache, e.g. 80")
        if self.gpu_mem_gib is not None and not MIN_GIB <= self.gpu_mem_gib <= MAX_GIB:
            raise SensprofError(f"--gpu-mem-gib {self.gpu_mem_gib:g} is outside what any machine holds ({MIN_GIB:g} to "
                                f"{MAX_GIB:g} GiB); pass the GiB of KV cache, e.g. 80")
        sglang.check_tp(self.tp)
        if self.tp != 1 and self.format != "sglang":
            raise SensprofError("--tp is for --format sglang (its scales file is keyed by TP rank)")
        if self.write_checkpoint and self.format != "vllm":
            raise SensprofError("--write-checkpoint is for --format vllm; use --scales-out for sglang")
        if self.scales_out and self.format != "sglang":
            raise SensprofError("--scales-out is for --format sglang; use --write-checkpoint DIR for vllm")
        if self.hub_id is not None and self.format != "vllm":
            raise SensprofError("--hub-id is for --format vllm (sglang and llama.cpp serve the GGUF file itself)")
        if self.scales_out:
            check_writable(self.scales_out, "--scales-out", "file")
        if self.write_checkpoint:
            check_checkpoint_dir(self.write_checkpoint)


def check_format(plan: Plan, fmt: str) -> None:
    if fmt not in FORMATS:
        raise SensprofError(f"unknown --format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if plan.target != fmt:
        raise SensprofError(
            f"this plan targets {plan.target!r}, which {fmt} cannot express; re-plan with "
            f"`sensprof plan PROFILE_DIR --target {fmt} ...`")


def served_path(name: str) -> str:
    """The model as an engine names it: a built-in alias becomes its .gguf file."""
    from ..models import BUILTIN_MODELS, resolve_model

    if name in BUILTIN_MODELS:
        src = resolve_model(name)
        return os.path.join(src["path"], src["gguf_file"])
    return name


def export_plan(plan: Plan, opts: ExportOptions, load) -> str:
    """The command line and its comments; `load()` loads the plan's model (checked against the plan) when the
    format needs weights or --model was given. Without weights, the plan's layer count is checked against the
    named model's config where it is at hand."""
    check_format(plan, opts.format)
    opts.check()
    fmt = FORMATS[opts.format]
    name = opts.model or plan.model_id
    fmt.check(plan, opts, name)
    loaded = None
    if opts.model or fmt.needs_weights(opts):
        loaded = load()
    else:
        from ..models import config_layer_count

        n = config_layer_count(name)
        if n is not None:
            plan.check_layers([None] * n, name)
    argv, lines, fits_line = fmt.command(plan, opts, loaded, name, served_path(name))
    return "\n".join([command_line(argv), *memory_comments(plan, opts.gpu_mem_gib, fit=fits_line), *lines])


def memory_comments(plan: Plan, gpu_mem_gib: float, fit: bool = True) -> list[str]:
    """Bytes per token and, unless the engine's own pool arithmetic says it (vLLM), the tokens that fit."""
    s = predicted_summary(plan.layers)
    per_tok, bf16 = s["bytes_per_token"], s["bf16_bytes_per_token"]
    n, n_bf16 = int(gpu_mem_gib * GIB // per_tok), int(gpu_mem_gib * GIB // bf16)
    lines = [f"# KV cache: {per_tok:,.0f} bytes/token vs {bf16:,.0f} at bf16 ({bf16 / per_tok:.2f}x smaller, "
             f"{s['avg_bits']:.2f} bits/element)"]
    if fit:
        lines.append(f"# in {gpu_mem_gib:g} GiB of KV cache: {n:,} tokens vs {n_bf16:,} at bf16 (+{n - n_bf16:,})")
    serving = serving_line(plan)  # what the engine is predicted to measure at the plan's serving length, and its band
    if serving:
        lines.append(f"# {serving}")
    # the damage's own objective: a plan the selection took from another objective's candidate is re-summed in KL
    lines.append(f"# predicted damage (sum of per-layer {plan.predicted.objective}): {plan.predicted.damage:.3e}"
                 + (f"; all layers at once measured {plan.predicted.joint_summary()} that sum"
                    if plan.predicted.joint_factor else ""))
    return lines


def command_line(argv: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)
