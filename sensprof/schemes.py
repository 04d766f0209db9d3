"""Quantization schemes as data: one frozen dataclass, one registry, one name grammar.

Imports no torch, so the planner and exporters can use the registry too.
A name is a base scheme plus optional modifiers, in this order:
``_pre`` (keys quantized before RoPE), ``_r<R>`` (the most recent R tokens kept in full
precision), ``_s<S>`` (the first S "sink" tokens kept in full precision), e.g. ``int4_c32_pre_r128``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .engines.llamacpp.catalog import CHANNEL_ORDERS
from .engines.llamacpp.catalog import engine_schemes as llamacpp_schemes
from .engines.vllm.catalog import engine_schemes
from .errors import SensprofError

# "engine": an engine's own format (rotations, codebooks, packed scales) emulated by sensprof.engines.
FORMATS = ("none", "int", "fp8_e4m3", "fp8_e5m2", "engine")
# How statistics are grouped over a cached tensor of shape [batch, kv_heads, tokens, head_dim]:
#   tensor  one scale for the layer's whole tensor       head     one scale per KV head
#   token   per token, over groups of G channels         channel  per channel, over groups of G tokens
GRANULARITIES = ("tensor", "head", "token", "channel")
# How codes are derived:
#   fp8         scaled cast to a float8 format (saturating)
#   absmax      symmetric integers in [-(2^(b-1)-1), 2^(b-1)-1], scale = absmax / (2^(b-1)-1)
#   signed_max  llama.cpp q4_0/q5_0: scale = (value of largest magnitude) / -2^(b-1), codes 0..2^b-1
#   minmax      asymmetric: scale = (max-min)/(2^b-1), zero-point = min (KIVI, llama.cpp q4_1/q5_1)
#   engine      the registered emulation named by `emulation` (sensprof/engines/)
CODECS = ("none", "fp8", "absmax", "signed_max", "minmax", "engine")
SCALE_SOURCES = ("none", "dynamic", "unit", "calibrated")
# fp8 only: "nearest" is the saturating cast (round to nearest even) of the GPU writers; "toward_zero" is vLLM's
# CPU backend, which multiplies by the scale's inverse and truncates the mantissa (csrc/cpu/cpu_attn_fp8.hpp)
ROUNDINGS = ("nearest", "toward_zero")
# An orthogonal rotation the engine applies before the codec (rotation.py): "hadamard_keys" (the largest
# power-of-two block of at least 64 dividing head_dim) or "hadamard64", over its channel order: "halves" is the
# model's own, "interleaved" a Llama-family GGUF's (rotary pairs adjacent)
ROTATIONS = ("", "hadamard_keys", "hadamard64")


@dataclass(frozen=True, kw_only=True)
class QuantScheme:
    """How one cached tensor (a layer's K or V) is stored."""

    name: str
    format: str
    bits: int
    codec: str
    granularity: str = "tensor"
    group: int | None = None  # token: channels per group (None = whole head); channel: tokens per group
    scale_source: str = "dynamic"
    scale_bits: int = 16  # storage of each per-group/per-token scale
    zero_bits: int = 0  # storage of each per-group zero-point
    pre_rope: bool = False
    residual: int = 0
    sink: int = 0
    description: str = ""
    emulation: str = ""  # engine formats: the key of the write/read emulation (sensprof/engines/)
    tensor: str = ""  # "K" or "V" for a format that only one of them uses; "" for both
    scale_floor: float = 0.0  # dynamic scales below this are raised to it (vLLM per-token-head: 1e-6)
    query: str = ""  # keys only: the engine's transform of the query (e.g. its fp8 cast), an emulation key
    rounding: str = "nearest"  # fp8 codes: ROUNDINGS
    rotation: str = ""  # ROTATIONS: K or V rotated before the codec, the query with the keys (llama.cpp)
    channel_order: str = "halves"  # CHANNEL_ORDERS: the channel order the rotation acts on

    def __post_init__(self):
        def bad(what):
            raise SensprofError(f"invalid scheme {self.name!r}: {what}")

        if self.format not in FORMATS:
            bad(f"format {self.format!r} is not one of {FORMATS}")
        if self.codec not in CODECS:
            bad(f"codec {self.codec!r} is not one of {CODECS}")
        if self.granularity not in GRANULARITIES:
            bad(f"granularity {self.granularity!r} is not one of {GRANULARITIES}")
        if self.scale_source not in SCALE_SOURCES:
            bad(f"scale source {self.scale_source!r} is not one of {SCALE_SOURCES}")
        if (self.format == "engine") != (self.codec == "engine") or (self.codec == "engine") != bool(self.emulation):
            bad("engine formats use the engine codec and name their emulation")
        if self.rounding not in ROUNDINGS or (self.rounding != "nearest" and self.codec != "fp8"):
            bad(f"rounding {self.rounding!r} is not one of {ROUNDINGS} (toward_zero is for fp8 codes)")
        if self.rotation not in ROTATIONS or self.channel_order not in CHANNEL_ORDERS:
            bad(f"rotation {self.rotation!r} / channel order {self.channel_order!r}: choose from {ROTATIONS} and "
                f"{CHANNEL_ORDERS}")
        if self.rotation and (self.is_engine or self.codec == "none"):
            bad("a rotation wraps one of sensprof's codecs (an engine format rotates inside its emulation)")
        if self.tensor not in ("", "K", "V"):
            bad(f"tensor {self.tensor!r} is not K, V or empty")
        if self.query and self.tensor != "K":
            bad("a query transform belongs to a key scheme (tensor K)")
        if self.format == "int" and not 2 <= self.bits <= 8:
            bad("integer schemes need 2..8 bits")
        if self.format.startswith("fp8") and (self.bits != 8 or self.codec != "fp8"):
            bad("fp8 formats use the fp8 codec and 8 bits")
        if self.codec == "fp8" and not self.format.startswith("fp8"):
            bad("the fp8 codec needs an fp8 format (fp8_e4m3 or fp8_e5m2)")
        if (self.format == "none") != (self.codec == "none"):
            bad("only the unquantized format uses the 'none' codec")
        if self.group is not None and self.group < 1:
            bad("group must be positive")
        if self.granularity == "channel" and self.group is None:
            bad("per-channel schemes need a token group size")
        if self.residual < 0 or self.sink < 0:
            bad("residual and sink must be >= 0")
        if self.scale_source == "calibrated" and self.granularity not in ("tensor", "head"):
            bad("calibrated scales are per tensor or per head")

    @property
    def is_identity(self) -> bool:
        return self.format == "none"

    def applies_to(self, tensor: str) -> bool:
        """Pre-RoPE storage only means something for keys; some engine formats exist for K or V only."""
        if self.tensor and tensor != self.tensor:
            return False
        return not (self.pre_rope and tensor != "K")

    @property
    def is_engine(self) -> bool:
        return self.format == "engine"


def _base_schemes() -> list[QuantScheme]:
    fixed = dict(scale_source="calibrated", scale_bits=0)  # one scale per layer or head, kept beside the cache
    dyn32 = dict(granularity="token", scale_source="dynamic", scale_bits=32, scale_floor=1e-6)  # vLLM per token-head
    block32 = dict(format="int", granularity="token", group=32, scale_source="dynamic", scale_bits=16)  # llama.cpp
    s: list[QuantScheme] = [
        QuantScheme(name="none", format="none", bits=16, codec="none", scale_source="none", scale_bits=0,
                    description="unquantized: the model dtype (16-bit storage)"),
    ]
    for fmt in ("fp8_e4m3", "fp8_e5m2"):
        s += [
            QuantScheme(name=fmt, format=fmt, bits=8, codec="fp8", scale_source="unit", scale_bits=0,
                        description=f"{fmt}, scale 1.0: what serving engines do uncalibrated"),
            QuantScheme(name=f"{fmt}_cal", format=fmt, bits=8, codec="fp8", **fixed,
                        description=f"{fmt}, one calibrated scale per layer (absmax / fp8 max)"),
            QuantScheme(name=f"{fmt}_head", format=fmt, bits=8, codec="fp8", granularity="head", **fixed,
                        description=f"{fmt}, one calibrated scale per KV head"),
        ]
    s += [
        QuantScheme(name="fp8_per_token_head", format="fp8_e4m3", bits=8, codec="fp8", **dyn32,
                    description="vLLM fp8_per_token_head: e4m3 with a dynamic fp32 scale per token and head"),
        QuantScheme(name="int8", format="int", bits=8, codec="absmax", **fixed,
                    description="int8 symmetric, one calibrated scale per layer"),
        QuantScheme(name="int8_per_token_head", format="int", bits=8, codec="absmax", **dyn32,
                    description="vLLM int8_per_token_head: symmetric, dynamic fp32 scale per token and head"),
        # llama.cpp cache types: per token, blocks of 32 along the head dimension, fp16 scales.
        QuantScheme(name="q8_0", bits=8, codec="absmax", **block32,
                    description="llama.cpp q8_0: symmetric 8-bit blocks of 32, fp16 scale"),
        QuantScheme(name="q4_0", bits=4, codec="signed_max", **block32,
                    description="llama.cpp q4_0: symmetric 4-bit blocks of 32, fp16 scale"),
        QuantScheme(name="q4_1", bits=4, codec="minmax", zero_bits=16, **block32,
                    description="llama.cpp q4_1: 4-bit blocks of 32 with fp16 scale and min"),
        QuantScheme(name="q5_0", bits=5, codec="signed_max", **block32,
                    description="llama.cpp q5_0: symmetric 5-bit blocks of 32, fp16 scale"),
        QuantScheme(name="q5_1", bits=5, codec="minmax", zero_bits=16, **block32,
                    description="llama.cpp q5_1: 5-bit blocks of 32 with fp16 scale and min"),
    ]
    kivi = dict(format="int", codec="minmax", scale_source="dynamic", scale_bits=16, zero_bits=16)
    for bits in (8, 6, 5, 4, 3, 2):
        for g in (32, 64, 128):
            s.append(QuantScheme(name=f"int{bits}_c{g}", bits=bits, granularity="channel", group=g, **kivi,
                                 description=f"int{bits} asymmetric per channel over groups of {g} tokens (KIVI keys)"))
            s.append(QuantScheme(name=f"int{bits}_t{g}", bits=bits, granularity="token", group=g, **kivi,
                                 description=f"int{bits} asymmetric per token over groups of {g} channels (KIVI values)"))
    return s


REGISTRY: dict[str, QuantScheme] = {s.name: s for s in _base_schemes()}


def _engine_scheme(fields: dict) -> QuantScheme:
    """One engine format from its catalog's fields; `like` names the registered scheme it varies."""
    fields = dict(fields)
    like = fields.pop("like", None)
    if like is None:
        return QuantScheme(**fields)
    base = REGISTRY[like]
    return dataclasses.replace(base, **{**fields, "description": f"{base.description}; {fields['description']}"})


def _register_engine_schemes() -> None:
    """Engine formats live beside their emulations (sensprof/engines/); the registry asks their catalog, which is
    data below it (no torch, nothing imported from here)."""
    for fields in (*engine_schemes(), *llamacpp_schemes()):
        s = _engine_scheme(fields)
        REGISTRY[s.name] = s


_register_engine_schemes()

# The default menus, per tensor: keys per channel (outlier channels share a scale only along tokens) over 32-, 64-
# and 128-token groups (64: the uniform KIVI setting that beat 5-bit plans made without it, docs/plan-quality.md),
# values per token, 2 to 8 bits in small steps; the lowest-bit keys also with 4 sink tokens, and 64-token key groups
# and 64-channel value groups at every bit width also with 4 sink tokens and a 32-token residual window (a short
# one: a profile's few hundred tokens would make a long window look cheaper than it is at length). Those are what
# won among every uniform setting sensprof stores, at every budget, on both real models (issue 38; per-layer plans
# made from them: docs/plan-quality.md). The plain layouts stay: a sliding-window layer that outgrows its sinks is
# priced by them (sensprof.planning.pricing.sinkless_pricing).
DEFAULT_K_SCHEMES = tuple(
    [f"int{b}_c{g}" for b in (2, 3, 4, 5, 6, 8) for g in (32, 64, 128)]
    + ["fp8_e4m3_cal", "int2_c32_s4", "int3_c32_s4", "int2_c32_r32_s4", "int3_c32_r32_s4"]
    + [f"int{b}_c64_r32_s4" for b in (2, 3, 4, 5, 6, 8)]
    + [f"int{b}_c64_pre{tail}" for tail in ("", "_r32_s4") for b in (2, 3, 4, 5, 6, 8)])
DEFAULT_V_SCHEMES = tuple([f"int{b}_t{g}" for b in (2, 3, 4, 5, 6, 8) for g in (32, 64)] + ["fp8_e4m3"]
                          + [f"int{b}_t64_r32_s4" for b in (2, 3, 4, 5, 6, 8)])
# The long-context menus (`profile --menus long`): the layouts that won at length on both real models (issue 38) -
# 64-token key groups and 64-channel value groups, 2 to 8 bits, each with 4 sink tokens and a 32-token residual
# window, plus 32-token key groups at 2 and 3 bits - and keys without the sinks and window (64-token groups at 2 to
# 8 bits, 128-token groups at 3 and 4): what the sinks and window buy a key differs by layer more than any other
# choice measured, and SmolLM2-135M's per-layer plans that may drop them measured 0.41-0.47x the best uniform
# setting found at 3-6 bits and 1024 tokens (docs/plan-quality.md) - for a profile at the length it serves.
# Each key also before RoPE (`_pre`, before the `_r`/`_s` modifiers), listed after all of them: SmolLM2-135M's
# one-window plans with them measured 0.83-0.93x those without at 3-6 bits (docs/plan-quality.md). Values also
# without sinks and window at 2 to 4 bits, and plain 2-bit keys: a 32-token window at 16 bits costs half a bit per
# element at 1024 tokens, which left 3-bit plans at that length below the menu's least budget (3.28 bits on Gemma 3
# 270M), and then, with plain values alone, behind the uniform int2_c64_pre / int2_t64_r32_s4 (2026-12-08).
_LONG_K_LAYOUTS = ([(b, 64, "_r32_s4") for b in (2, 3, 4, 5, 6, 8)] + [(b, 32, "_r32_s4") for b in (2, 3)]
                   + [(b, 64, "") for b in (2, 3, 4, 5, 6, 8)] + [(b, 128, "") for b in (3, 4)])
LONG_K_SCHEMES = tuple(f"int{b}_c{g}{pre}{tail}" for pre in ("", "_pre") for b, g, tail in _LONG_K_LAYOUTS)
LONG_V_SCHEMES = tuple([f"int{b}_t64_r32_s4" for b in (2, 3, 4, 5, 6, 8)] + [f"int{b}_t64" for b in (2, 3, 4)])
MENUS = {"default": (DEFAULT_K_SCHEMES, DEFAULT_V_SCHEMES), "long": (LONG_K_SCHEMES, LONG_V_SCHEMES)}
# The old small menu, profiled on K and V alike; kept for `--schemes legacy`-style comparisons in benchmarks.
DEFAULT_SCHEMES = (
    "fp8_e4m3",
    "int8_per_token_head",
    "int4_per_token_head",
    "q4_0",
    "int4_c32",
    "int4_t32",
    "int2_c32",
    "int2_t32",
)

_MODIFIERS = re.compile(r"^(?P<base>.+?)(?P<pre>_pre)?(?:_r(?P<r>\d+))?(?:_s(?P<s>\d+))?$")


# Schemes whose emulation changed after profiles were written with it: a profile records each scheme's revision
# (absent = 1), and the planner ignores cells measured by an older one. 2: int4_per_token_head follows vLLM's
# rotated asymmetric write (it was a symmetric +-7 per-token-head quantizer).
REVISIONS = {"int4_per_token_head": 2}


def scheme_revision(name: str) -> int:
    return REVISIONS.get(name, 1)


def get_scheme(name: str) -> QuantScheme:
    """Look a scheme up by name, modifiers included; unknown names list the valid ones."""
    if name in REGISTRY:
        return REGISTRY[name]
    m = _MODIFIERS.match(name)
    base = REGISTRY.get(m.group("base")) if m else None
    if base is not None and (base.is_engine or base.query or base.rotation):
        raise SensprofError(f"scheme {m.group('base')!r} is an engine's own format and takes no modifiers; "
                            f"use {m.group('base')!r} as it is")
    if base is None or base.is_identity:
        raise SensprofError(
            f"unknown scheme {name!r}; valid schemes are {', '.join(scheme_names())}, optionally "
            "followed by _pre (keys before RoPE), _r<R> (R recent tokens kept) and _s<S> (S sink tokens kept)")
    return dataclasses.replace(
        base, name=name, pre_rope=bool(m.group("pre")),
        residual=int(m.group("r") or 0), sink=int(m.group("s") or 0))


def scheme_names() -> list[str]:
    return [n for n in REGISTRY if n != "none"]


def parse_schemes(names) -> list[QuantScheme]:
    """Comma- or list-separated names, de-duplicated in order."""
    from .specs import parse_list

    flat = ",".join(str(x) for x in ([names] if isinstance(names, str) else names))
    if not flat.replace(",", "").strip():
        raise SensprofError("no schemes given; pass --schemes with one or more of: " + ", ".join(scheme_names()))
    out: dict[str, QuantScheme] = {}
    for scheme in parse_list(flat, "--schemes", get_scheme):
        if scheme.is_identity:
            raise SensprofError(f"scheme {scheme.name!r} keeps the model dtype, so there is nothing to profile; "
                                "drop it from --schemes (the planner always has it)")
        out.setdefault(scheme.name, scheme)
    return list(out.values())


@dataclass(frozen=True)
class Menu:
    """The candidate schemes of each tensor: what the profiler measures and the planner chooses among."""

    k: tuple[QuantScheme, ...]
    v: tuple[QuantScheme, ...]

    def for_tensor(self, tensor: str) -> tuple[QuantScheme, ...]:
        return self.k if tensor == "K" else self.v

    @property
    def schemes(self) -> list[QuantScheme]:
        """Every scheme once (K's first), for metadata."""
        return list({s.name: s for s in (*self.k, *self.v)}.values())


def parse_menu(schemes=None, k_schemes=None, v_schemes=None, menus: str = "default") -> Menu:
    """--schemes (both tensors), --k-schemes and --v-schemes; a missing tensor gets the named menus' list (--menus).

    Refuses a key list entry that is not a key layout and a value entry that is a key-only layout."""
    both = parse_schemes(schemes) if schemes else []
    k = _merge(both, parse_schemes(k_schemes) if k_schemes else [])
    v = _merge(both, parse_schemes(v_schemes) if v_schemes else [])
    if menus not in MENUS:
        raise SensprofError(f"unknown --menus {menus!r}: choose {' or '.join(MENUS)}")
    if not schemes and not k_schemes:
        k = parse_schemes(MENUS[menus][0])
    if not schemes and not v_schemes:
        v = parse_schemes(MENUS[menus][1])
    for s in (parse_schemes(k_schemes) if k_schemes else []):
        if not s.applies_to("K"):
            raise SensprofError(f"--k-schemes entry {s.name!r} is a value-only format; move it to --v-schemes")
        if _VALUE_LAYOUT.match(s.name):
            raise SensprofError(f"--k-schemes entry {s.name!r} is a value layout (per token over channel groups, "
                                "which outlier key channels ruin); use a key layout such as int4_c32, or --schemes")
    for s in (parse_schemes(v_schemes) if v_schemes else []):
        if not s.applies_to("V"):
            why = "quantizes before RoPE, which only keys have" if s.pre_rope else "is a key-only format"
            raise SensprofError(f"--v-schemes entry {s.name!r} {why}; move it to --k-schemes")
    k = [s for s in k if s.applies_to("K")]
    v = [s for s in v if s.applies_to("V")]
    if not k and not v:
        raise SensprofError("the menu is empty: no scheme applies to K or V; see `sensprof schemes`")
    return Menu(tuple(k), tuple(v))


_VALUE_LAYOUT = re.compile(r"^int\d_t\d+")


def _merge(a: list[QuantScheme], b: list[QuantScheme]) -> list[QuantScheme]:
    return list({s.name: s for s in (*a, *b)}.values())
