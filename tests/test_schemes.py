"""Scheme registry, name grammar (_pre/_r<R>/_s<S>), validation and parse_schemes."""

from __future__ import annotations

import dataclasses

import pytest

from sensprof.errors import SensprofError
from sensprof.schemes import (
    DEFAULT_SCHEMES,
    REGISTRY,
    QuantScheme,
    get_scheme,
    parse_schemes,
    scheme_names,
)

INT_BITS = (8, 6, 5, 4, 3, 2)
GROUPS = (32, 64, 128)

EXPECTED_NAMES = (
    {"none"}
    | {f"{f}{suffix}" for f in ("fp8_e4m3", "fp8_e5m2") for suffix in ("", "_cal", "_head")}
    | {"fp8_per_token_head", "int8", "int8_per_token_head"}
    | {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1"}
    | {f"int{b}_{kind}{g}" for b in INT_BITS for kind in "ct" for g in GROUPS}
)
# vLLM's own formats (sensprof/engines/vllm/catalog.py): the dtype's name when K and V share a format,
# <dtype>.K / <dtype>.V when they differ, _qfp8 for keys whose query vLLM casts to fp8 too.
TQ = ("turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc")
OCTAVE = ("octave_k3v4", "octave_k3v3", "octave_k3v3_compact")
ENGINE_NAMES = (
    {"int4_per_token_head", "nvfp4", "nvfp4_4over6", "nvfp4_qfp8", "nvfp4_4over6_qfp8", "fp8_e4m3_qfp8",
     "fp8_e4m3_cal_qfp8", "turboquant_k8v4_e4b15.K", "ultraquant_4bit.K", "ultraquant_4bit.V",
     "fp8_e4m3_rtz", "fp8_e4m3_cal_rtz", "fp8_e5m2_rtz"}
    # llama.cpp: rotated keys (both channel orders) and values, engines/llamacpp/catalog.py
    | {f"llamacpp_{t}.{x}" for t in ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0") for x in ("K", "K_interleaved", "V")}
    | {f"{p}.{t}" for p in TQ + OCTAVE for t in "KV"}
)
EXPECTED_NAMES |= ENGINE_NAMES


def _core(s: QuantScheme) -> tuple:
    """The fields that say how a tensor is stored (not the name, modifiers or description)."""
    return (s.format, s.bits, s.codec, s.granularity, s.group, s.scale_source, s.scale_bits, s.zero_bits)


# ------------------------------------------------------------------------------------------ registry


def test_registry_has_exactly_the_expected_names():
    assert set(REGISTRY) == EXPECTED_NAMES
    assert len(REGISTRY) == len(EXPECTED_NAMES) == 1 + 6 + 3 + 5 + 36 + 13 + 14 + 15  # llama.cpp: 5 types x 3


def test_registry_keys_match_scheme_names():
    for key, s in REGISTRY.items():
        assert s.name == key
        assert isinstance(s, QuantScheme)


def test_scheme_names_lists_everything_but_identity_in_registry_order():
    assert scheme_names() == [n for n in REGISTRY if n != "none"]
    assert "none" not in scheme_names()
    assert set(scheme_names()) == EXPECTED_NAMES - {"none"}


def test_default_schemes_are_registered():
    assert len(DEFAULT_SCHEMES) == len(set(DEFAULT_SCHEMES))
    for n in DEFAULT_SCHEMES:
        assert n in REGISTRY


def test_only_none_is_identity():
    assert REGISTRY["none"].is_identity
    assert _core(REGISTRY["none"])[:4] == ("none", 16, "none", "tensor")
    assert [n for n, s in REGISTRY.items() if s.is_identity] == ["none"]


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2"])
def test_fp8_tensor_and_head_schemes(fmt):
    assert _core(REGISTRY[fmt]) == (fmt, 8, "fp8", "tensor", None, "unit", 0, 0)
    assert _core(REGISTRY[f"{fmt}_cal"]) == (fmt, 8, "fp8", "tensor", None, "calibrated", 0, 0)
    assert _core(REGISTRY[f"{fmt}_head"]) == (fmt, 8, "fp8", "head", None, "calibrated", 0, 0)


def test_cpu_fp8_schemes_round_toward_zero():
    """vLLM's CPU backend: the same storage as the GPU's fp8, codes rounded toward zero (catalog.py registers them)."""
    for name, like in (("fp8_e4m3_rtz", "fp8_e4m3"), ("fp8_e4m3_cal_rtz", "fp8_e4m3_cal"), ("fp8_e5m2_rtz", "fp8_e5m2")):
        assert _core(REGISTRY[name]) == _core(REGISTRY[like])
        assert (REGISTRY[name].rounding, REGISTRY[like].rounding) == ("toward_zero", "nearest")
    with pytest.raises(SensprofError, match="toward_zero is for fp8 codes"):
        QuantScheme(name="x", format="int", bits=4, codec="minmax", rounding="toward_zero")


@pytest.mark.parametrize("name, core", [
    ("fp8_per_token_head", ("fp8_e4m3", 8, "fp8", "token", None, "dynamic", 32, 0)),
    ("int8", ("int", 8, "absmax", "tensor", None, "calibrated", 0, 0)),
    ("int8_per_token_head", ("int", 8, "absmax", "token", None, "dynamic", 32, 0)),
    # llama.cpp cache types: blocks of 32 along head_dim, fp16 scale (and fp16 min for _1).
    ("q8_0", ("int", 8, "absmax", "token", 32, "dynamic", 16, 0)),
    ("q4_0", ("int", 4, "signed_max", "token", 32, "dynamic", 16, 0)),
    ("q4_1", ("int", 4, "minmax", "token", 32, "dynamic", 16, 16)),
    ("q5_0", ("int", 5, "signed_max", "token", 32, "dynamic", 16, 0)),
    ("q5_1", ("int", 5, "minmax", "token", 32, "dynamic", 16, 16)),
])
def test_named_schemes(name, core):
    assert _core(REGISTRY[name]) == core


@pytest.mark.parametrize("bits", INT_BITS)
@pytest.mark.parametrize("group", GROUPS)
def test_kivi_style_schemes(bits, group):
    c = REGISTRY[f"int{bits}_c{group}"]
    t = REGISTRY[f"int{bits}_t{group}"]
    assert _core(c) == ("int", bits, "minmax", "channel", group, "dynamic", 16, 16)
    assert _core(t) == ("int", bits, "minmax", "token", group, "dynamic", 16, 16)


def test_base_schemes_have_no_modifiers_and_a_description():
    for s in REGISTRY.values():
        assert (s.pre_rope, s.residual, s.sink) == (False, 0, 0), s.name
        assert s.description, s.name


# ------------------------------------------------------------------------------------ name modifiers


@pytest.mark.parametrize("name, base, pre, residual, sink", [
    ("int4_c32_pre", "int4_c32", True, 0, 0),
    ("int4_c32_r128", "int4_c32", False, 128, 0),
    ("int4_c32_s4", "int4_c32", False, 0, 4),
    ("int4_c32_pre_r128", "int4_c32", True, 128, 0),
    ("int4_c32_pre_s4", "int4_c32", True, 0, 4),
    ("int4_c32_r128_s4", "int4_c32", False, 128, 4),
    ("int4_c32_pre_r128_s4", "int4_c32", True, 128, 4),
    ("int2_t128_r0", "int2_t128", False, 0, 0),
    ("int8_c64_r7_s1000", "int8_c64", False, 7, 1000),
    ("q4_0_r64", "q4_0", False, 64, 0),
    ("q5_1_pre_s2", "q5_1", True, 0, 2),
    ("fp8_e4m3_s8", "fp8_e4m3", False, 0, 8),
    ("fp8_e5m2_cal_pre", "fp8_e5m2_cal", True, 0, 0),
    ("fp8_e4m3_head_r16", "fp8_e4m3_head", False, 16, 0),
    ("fp8_per_token_head_pre_r32_s4", "fp8_per_token_head", True, 32, 4),
    ("int8_per_token_head_r3", "int8_per_token_head", False, 3, 0),
    ("int8_s1", "int8", False, 0, 1),
])
def test_modifiers_are_parsed(name, base, pre, residual, sink):
    s = get_scheme(name)
    assert s.name == name
    assert (s.pre_rope, s.residual, s.sink) == (pre, residual, sink)
    assert _core(s) == _core(REGISTRY[base])
    assert s.description == REGISTRY[base].description


@pytest.mark.parametrize("name", ["int4_per_token_head_pre", "turboquant_k8v4.K_r8", "fp8_e4m3_qfp8_s4"])
def test_engine_formats_take_no_modifiers(name):
    with pytest.raises(SensprofError, match="engine's own format and takes no modifiers"):
        get_scheme(name)


def test_engine_schemes_name_their_emulation_and_tensor():
    from sensprof.engines.emulations import get_emulation, get_query_transform

    for name in ENGINE_NAMES:
        s = REGISTRY[name]
        if s.is_engine:
            assert s.emulation.startswith("vllm.")
            key = f"{s.emulation}.{s.tensor}"
            assert get_emulation(key if s.tensor and name.split(".")[-1] in "KV" else s.emulation)
        if name.endswith((".K", "_qfp8", ".K_interleaved")):
            assert s.applies_to("K") and not s.applies_to("V"), name
        elif name.endswith(".V"):
            assert s.applies_to("V") and not s.applies_to("K"), name
        else:
            assert s.applies_to("K") and s.applies_to("V"), name
        if s.query:
            assert get_query_transform(s.query)


def test_modifiers_leave_the_registry_untouched():
    before = dict(REGISTRY)
    s = get_scheme("int4_c32_pre_r128_s4")
    assert REGISTRY == before
    base = REGISTRY["int4_c32"]
    assert (base.name, base.pre_rope, base.residual, base.sink) == ("int4_c32", False, 0, 0)
    assert s is not REGISTRY["int4_c32"]
    assert "int4_c32_pre_r128_s4" not in REGISTRY


@pytest.mark.parametrize("name", ["none", "int4_c32", "q4_0", "fp8_e4m3_head"])
def test_plain_names_return_the_registry_object(name):
    assert get_scheme(name) is REGISTRY[name]


def test_modified_schemes_are_equal_by_value():
    assert get_scheme("int4_t32_r8") == get_scheme("int4_t32_r8")
    assert get_scheme("int4_t32_r8") != get_scheme("int4_t32_r9")
    assert hash(get_scheme("int4_t32_r8")) == hash(get_scheme("int4_t32_r8"))


@pytest.mark.parametrize("name", [
    "",
    "int4",
    "int4_c16",  # group not in the registry
    "int1_c32",
    "int9_t32",
    "INT4_C32",  # names are case sensitive
    "q4_2",
    "fp8",
    "fp8_e4m3_tensor",
    "int4_c32_s4_r128",  # wrong modifier order
    "int4_c32_r128_pre",  # wrong modifier order
    "int4_c32_pre_pre",
    "int4_c32_r",  # modifier without a number
    "int4_c32_rx",
    "int4_c32_s",
    "int4_c32_r-1",
    "int4_c32_r1.5",
    "int4_c32_r128_",
    " int4_c32",  # get_scheme does not strip (parse_schemes does)
    "none_r4",  # the identity takes no modifiers
    "none_pre",
    "none_s4",
    "_pre",
    "_r128",
])
def test_unknown_names_raise_with_the_list_of_valid_schemes(name):
    with pytest.raises(SensprofError) as info:
        get_scheme(name)
    msg = str(info.value)
    assert repr(name) in msg
    for valid in scheme_names():
        assert valid in msg
    for modifier in ("_pre", "_r<R>", "_s<S>"):
        assert modifier in msg


def test_sensprof_error_is_an_exception():
    assert issubclass(SensprofError, Exception)


# ------------------------------------------------------------------------------------ validation


def _valid(**kw):
    base = dict(name="x", format="int", bits=4, codec="minmax", granularity="token", group=32)
    base.update(kw)
    return base


@pytest.mark.parametrize("kw", [
    dict(format="int4"),
    dict(format="fp16"),
    dict(codec="round"),
    dict(granularity="block"),
    dict(granularity="group"),
    dict(scale_source="static"),
    dict(bits=1),
    dict(bits=9),
    dict(bits=0),
    dict(bits=16),
    dict(format="fp8_e4m3", bits=4, codec="fp8"),
    dict(format="fp8_e4m3", bits=8, codec="absmax"),
    dict(format="fp8_e5m2", bits=8, codec="minmax"),
    dict(group=0),
    dict(group=-32),
    dict(granularity="channel", group=None),
    dict(residual=-1),
    dict(sink=-1),
    dict(granularity="token", group=None, scale_source="calibrated"),
    dict(granularity="channel", group=32, scale_source="calibrated"),
])
def test_invalid_values_raise_sensprof_error(kw):
    with pytest.raises(SensprofError) as info:
        QuantScheme(**_valid(**kw))
    assert "'x'" in str(info.value)


@pytest.mark.parametrize("kw", [
    dict(bits=2),
    dict(bits=8),
    dict(group=1),
    dict(group=None),
    dict(granularity="channel", group=1),
    dict(granularity="tensor", group=None, scale_source="calibrated"),
    dict(granularity="head", group=None, scale_source="calibrated"),
    dict(format="fp8_e5m2", bits=8, codec="fp8", granularity="head", group=None, scale_source="unit"),
    dict(residual=0, sink=0),
    dict(residual=10**6, sink=10**6),
])
def test_boundary_values_are_accepted(kw):
    s = QuantScheme(**_valid(**kw))
    for k, v in kw.items():
        assert getattr(s, k) == v


def test_replace_revalidates():
    with pytest.raises(SensprofError):
        dataclasses.replace(REGISTRY["int4_c32"], group=None)
    with pytest.raises(SensprofError):
        dataclasses.replace(REGISTRY["q4_0"], bits=12)


def test_fp8_codec_requires_an_fp8_format():
    with pytest.raises(SensprofError):
        QuantScheme(name="x", format="int", bits=8, codec="fp8")


def test_schemes_are_built_with_keywords():
    with pytest.raises(TypeError):
        QuantScheme("x", "int", 8, "absmax")


# ------------------------------------------------------------------------------------ frozen


@pytest.mark.parametrize("field, value", [("bits", 2), ("residual", 5), ("name", "y"), ("pre_rope", True)])
def test_schemes_are_frozen(field, value):
    s = get_scheme("int4_c32_r8")
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(s, field, value)
    assert getattr(s, field) != value
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(REGISTRY["q4_0"], field, value)


# ------------------------------------------------------------------------------------ applies_to


@pytest.mark.parametrize("name", ["int4_c32_pre", "int2_c128_pre_r64", "q4_0_pre_s4", "fp8_e4m3_pre"])
def test_pre_rope_schemes_apply_only_to_keys(name):
    s = get_scheme(name)
    assert s.pre_rope
    assert s.applies_to("K")
    assert not s.applies_to("V")
    assert not s.applies_to("k")  # exact tensor name


@pytest.mark.parametrize("name", ["int4_c32", "int4_t32_r128_s4", "q4_0", "fp8_e4m3", "none"])
def test_post_rope_schemes_apply_to_keys_and_values(name):
    s = get_scheme(name)
    assert not s.pre_rope
    assert s.applies_to("K") and s.applies_to("V")


# ------------------------------------------------------------------------------------ parse_schemes


def _names(schemes):
    return [s.name for s in schemes]


@pytest.mark.parametrize("arg, expected", [
    ("int4_c32", ["int4_c32"]),
    ("int4_c32,q4_0", ["int4_c32", "q4_0"]),
    (" q4_0 , int4_c32 ,q4_0,", ["q4_0", "int4_c32"]),
    ("q4_0,,q4_0", ["q4_0"]),
    (["int2_t32", "int2_c32,int2_t32", "q8_0"], ["int2_t32", "int2_c32", "q8_0"]),
    (("fp8_e4m3", "fp8_e4m3_cal"), ["fp8_e4m3", "fp8_e4m3_cal"]),
    ("int4_c32,int4_c32_r128,int4_c32_pre_r128_s4,int4_c32_r128",
     ["int4_c32", "int4_c32_r128", "int4_c32_pre_r128_s4"]),
])
def test_parse_schemes_splits_and_deduplicates_in_order(arg, expected):
    out = parse_schemes(arg)
    assert _names(out) == expected
    for s in out:
        assert s == get_scheme(s.name)


def test_parse_schemes_of_the_defaults():
    assert _names(parse_schemes(",".join(DEFAULT_SCHEMES))) == list(DEFAULT_SCHEMES)
    assert _names(parse_schemes(list(DEFAULT_SCHEMES) * 2)) == list(DEFAULT_SCHEMES)


@pytest.mark.parametrize("arg", ["", " ", ",", " , ,", [], [""], ["", ","]])
def test_parse_schemes_needs_at_least_one(arg):
    with pytest.raises(SensprofError) as info:
        parse_schemes(arg)
    msg = str(info.value)
    for valid in scheme_names():
        assert valid in msg


@pytest.mark.parametrize("arg", ["none", "int8,none", ["q4_0", " none "]])
def test_parse_schemes_rejects_the_identity(arg):
    """'none' is a valid scheme (the planner's baseline) but there is nothing to profile with it."""
    with pytest.raises(SensprofError, match="'none'.*nothing to profile"):
        parse_schemes(arg)


@pytest.mark.parametrize("arg", ["q4_0,q4_9", ["int4_c32", "bogus"], "int4_c32 r128"])
def test_parse_schemes_rejects_unknown_names(arg):
    with pytest.raises(SensprofError, match="unknown scheme"):
        parse_schemes(arg)
