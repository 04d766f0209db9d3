"""Damage priced for the reads a plan will really get, at the length it will serve (no torch).

A profile measures each cell on windows of L tokens, read as one of two regimes:
  streaming  sensprof's runtime and KIVI: sink tokens, the residual window and every per-channel key group not
             yet complete are held unquantized, so the first positions of a window read nothing quantized (with
             int4_c128 keys the first 127);
  all        an engine without residual windows (vLLM, SGLang, llama.cpp): every cached token past the scheme's
             sinks and residual window is read quantized, a per-channel group with its whole group's statistics.
A target is served in one regime (TARGET_READS). A cell's mean KL over a window averages over its positions,
and the positions that read nothing quantized contribute exactly 0 (the profiler replays only the others). At a
serving length N far fewer positions are unmoved than in a short profile window, so a cell priced at N is its
measured KL per moved position times the share of moved positions at N:

    priced(N) = measured(L) * moved(N) / moved(L),   moved(n) = (n - first(n)) / n

where first is the first query position that reads a quantized token. In the `all` regime first is the sinks
plus the residual window (the scale is ~1); in the streaming regime a per-channel group of G tokens adds G - 1.
What this keeps constant is the damage per moved position: that it does not grow with how much of the past is
quantized is the extrapolation's assumption, and a profile at several lengths (`--seq-len 256,1024`) measures
its error (`extrapolation_error`). A scheme whose window does not hold one whole group past its sinks and residual
window is not priced (`needed_len`): the profile is too short for it, and the planner says which --seq-len is.

Sliding-window layers: once a served cache is longer than a layer's window W, that layer no longer sees the first
tokens, so a scheme's sink tokens (`_s<S>`) protect nothing there. A profile of at most W tokens always saw them
(on Gemma 3 270M, `int3_c32_r32_s4` keys of a sliding layer measured 0.95x their profile at 256 tokens and 82x at
1024), so on such a layer a sink scheme is priced as the same scheme without sinks and residual window, measured on
that layer (`sinkless`; an upper bound: the residual window still helps), or not offered when that was not profiled.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..constants import LONG_ROUTE
from ..errors import SensprofError
from ..schemes import get_scheme

READS = ("streaming", "all")
TARGET_READS = {"sensprof": "streaming", "vllm": "all", "sglang": "all", "llamacpp": "all"}
DEFAULT_CONTEXT_LEN = 4096  # what a plan serves unless --context-len says otherwise (within the model's positions)
PRICED_COLUMNS = ("kl", "kl_std", "dnll")  # end-to-end means over positions; the local metrics are left as measured


def check_reads(reads: str) -> str:
    if reads not in READS:
        raise SensprofError(f"--reads {reads!r} is not streaming or all (streaming: a token group stays unquantized "
                            "until complete, as sensprof's runtime and KIVI hold it; all: every cached token is read "
                            "quantized, as an engine without residual windows reads it)")
    return reads


def target_reads(target: str) -> str:
    return TARGET_READS.get(target, "streaming")


def profile_reads(reads: str | None, target: str | None) -> str:
    """`profile --reads`: default the target's regime (streaming without a target); a regime the target's engine
    cannot serve is refused."""
    if reads is None:
        return target_reads(target) if target else "streaming"
    check_reads(reads)
    if target and reads != target_reads(target):
        own = target_reads(target)
        why = ("it holds no residual window or unquantized groups" if own == "all"
               else "its runtime holds incomplete groups unquantized")
        raise SensprofError(f"--reads {reads}: target {target} reads its cache {own} ({why}); drop --reads or pass "
                            f"--reads {own}")
    return reads


def regimes_differ(scheme_name: str) -> bool:
    """Whether the two regimes read this scheme differently: only per-channel token groups wait to be complete."""
    s = get_scheme(scheme_name)
    return s.granularity == "channel" and not s.is_identity and not s.is_engine and (s.group or 1) > 1


def first_read(scheme_name: str, reads: str) -> int:
    """The first query position (0-based) that reads a quantized token of this scheme (as taps.quantized_reads)."""
    s = get_scheme(scheme_name)
    if s.query:
        return 0
    first = s.sink + s.residual
    if reads == "streaming" and s.granularity == "channel":
        first += s.group - 1  # a token is quantized once its whole group is in (memory.quantized_token_count)
    return first


def moved_share(scheme_name: str, reads: str, n: int) -> float:
    """Share of a window's n positions that read something quantized."""
    return max(0, n - first_read(scheme_name, reads)) / n


def needed_len(scheme_name: str, reads: str) -> int:
    """The shortest profile window that prices this scheme: one whole group (per-channel schemes: G tokens) past
    its sinks and residual window, so that the window reads a group quantized with a whole group's statistics."""
    s = get_scheme(scheme_name)
    group = s.group if s.granularity == "channel" and s.group else 1
    return s.sink + s.residual + group


def scale(scheme_name: str, reads: str, profile_len: int, context_len: int) -> float:
    """priced(context_len) / measured(profile_len) for this scheme (module docstring)."""
    if scheme_name == "none":
        return 1.0
    at_profile = moved_share(scheme_name, reads, profile_len)
    if at_profile <= 0:
        return math.inf
    return moved_share(scheme_name, reads, context_len) / at_profile


@dataclass(frozen=True)
class Pricing:
    """How the damage a plan was chosen with relates to what the profile measured."""

    reads: str  # the target's read regime
    profile_reads: str  # the profile's
    profile_len: int
    context_len: int  # the serving length the damage is priced at
    scales: dict  # scheme -> priced / measured, for the schemes whose scale is not 1
    extrapolation_error: dict | None = None  # scheme -> measured / extrapolated at a longer profiled length
    sinkless: dict | None = None  # sliding layers whose sink schemes are priced without sinks (sinkless_pricing)

    def to_json(self) -> dict:
        return {"reads": self.reads, "profile_reads": self.profile_reads, "profile_len": self.profile_len,
                "context_len": self.context_len, "scales": dict(self.scales),
                "extrapolation_error": self.extrapolation_error,
                **({"sinkless": self.sinkless} if self.sinkless else {})}


def serving_context(meta: dict, context_len: int | None) -> int:
    """--context-len checked against the profile and the model: at least the profile's window, at most the model's
    positions; default DEFAULT_CONTEXT_LEN (the model's positions if fewer)."""
    profile_len = int(meta["settings"]["seq_len"])
    limit = meta.get("max_positions")
    if context_len is None:
        n = DEFAULT_CONTEXT_LEN if not limit else min(DEFAULT_CONTEXT_LEN, int(limit))
        return max(n, profile_len)
    if limit and context_len > int(limit):
        raise SensprofError(f"--context-len {context_len} is beyond the model's {limit} positions; pass at most {limit}")
    if context_len < profile_len:
        raise SensprofError(f"--context-len {context_len} is below the profile's {profile_len}-token windows, whose "
                            f"damage cannot be priced shorter; pass at least {profile_len}, or profile with "
                            f"--seq-len {context_len}")
    return context_len


def check_regime(meta: dict, target: str, schemes) -> str:
    """The regime the target reads its cache in; refuses a profile measured in the other one where it matters."""
    want, have = target_reads(target), meta.get("reads", "streaming")
    if want == have:
        return want
    differ = [s for s in schemes if s != "none" and regimes_differ(s)]
    if differ:
        raise SensprofError(f"target {target} reads its cache {want}, but the profile read {differ[0]} {have}: "
                            f"re-profile with --reads {want} (`sensprof profile ... --reads {want}`)")
    return want


def price(table, meta: dict, target: str, context_len: int | None, lengths_tables: dict | None = None,
          usable=None):
    """(the table with its damage priced for the target's reads at the serving length, Pricing).

    `usable`: the schemes the target can choose (default all the table's); `lengths_tables`: {L: table} of the
    profile's shorter lengths, to measure the extrapolation's error."""
    schemes = [s for s in dict.fromkeys(table.scheme) if usable is None or s in usable]
    reads = check_regime(meta, target, schemes)
    profile_len = int(meta["settings"]["seq_len"])
    n = serving_context(meta, context_len)
    have = meta.get("reads", "streaming")
    short = [(s, needed_len(s, have)) for s in schemes if needed_len(s, have) > profile_len]
    if short:
        s, need = max(short, key=lambda x: x[1])
        raise SensprofError(f"the profile's {profile_len}-token windows are too short to price {s} at {n} tokens (its "
                            f"windows read too few of its groups quantized): re-profile with --seq-len {need} or more, "
                            f"or without {s}")
    scales = {s: scale(s, have, profile_len, n) if s in schemes else 1.0 for s in dict.fromkeys(table.scheme)}  # unusable: never chosen
    out = table.copy()
    factor = out.scheme.map(scales).astype(float)
    for col in PRICED_COLUMNS:
        if col in out:
            out[col] = out[col] * factor
    out, sinkless = sinkless_pricing(out, meta.get("layers") or [], profile_len, n)
    error = extrapolation_error(table, lengths_tables or {}, have, profile_len)
    return out, Pricing(reads, have, profile_len, n,
                        {s: round(f, 6) for s, f in scales.items() if s in schemes and abs(f - 1) > 1e-9}, error,
                        sinkless)


def without_sinks(scheme_name: str) -> str:
    """The scheme less its residual window and sinks (int3_c32_r32_s4 -> int3_c32)."""
    return re.sub(r"_[rs]\d+", "", scheme_name)


def slid_layers(layers: list[dict], profile_len: int, n: int) -> list[int]:
    """Sliding-window layers whose window the profile never passed but a cache of n tokens does."""
    return [int(info["index"]) for info in layers
            if info.get("kind") == "sliding" and info.get("window") and profile_len <= int(info["window"]) < n]


def past_window_profile(seq_len: int, target: str | None, kl: str = LONG_ROUTE["kl"]) -> str:
    """The profile flags that measure sliding-window layers past their window: the long-context route for sensprof's
    own target (its long menu), the length alone for an engine's (whose menu is its dtypes)."""
    rest = "".join(f" --{k} {v}" for k, v in {**LONG_ROUTE, "kl": kl}.items())
    return f"--seq-len {seq_len}" + (rest if target in (None, "sensprof") else "")


def outgrown_windows_note(layers: list[dict], profile_len: int, n: int, target: str = "sensprof") -> str | None:
    """What a plan served past a sliding window its profile never passed should say: those layers' damage there is
    extrapolated from windows that never reached it, which ranked Gemma 3 270M's layers wrongly at 1024 tokens
    (docs/plan-quality.md, "On text of another kind"); None where no layer is so served."""
    slid = slid_layers(layers, profile_len, n)
    if not slid:
        return None
    w = max(int(info["window"]) for info in layers if int(info["index"]) in slid)
    return (f"the profile's {profile_len}-token windows never passed the {w}-token sliding window of {len(slid)} of "
            f"its {len(layers)} layers, which {n} tokens do, so their damage there is extrapolated; to measure it, "
            f"profile with {past_window_profile(min(n, 2 * w), target)}")


def sinkless_pricing(table, layers: list[dict], profile_len: int, n: int):
    """(the table with each sink scheme on a slid layer priced as its sinkless scheme there, or dropped where that
    was not profiled; {"layers": [...], "schemes": {scheme: priced as, or None}} or None): module docstring."""
    slid = slid_layers(layers, profile_len, n)
    sinks = [s for s in dict.fromkeys(table.scheme) if s != "none" and get_scheme(s).sink]
    if not slid or not sinks:
        return table, None
    out = table.copy()
    keyed = out.set_index(["layer", "tensor", "scheme"])
    cols = [c for c in PRICED_COLUMNS if c in out]
    priced_as = {}
    for s in sinks:
        base = without_sinks(s)
        rows = out.index[(out.scheme == s) & out.layer.isin(slid)]
        have = all((out.at[i, "layer"], out.at[i, "tensor"], base) in keyed.index for i in rows)
        priced_as[s] = base if have else None
        if not have:  # cannot be priced on those layers: not offered on any (the planner needs every layer's cell)
            out = out[out.scheme != s]
            continue
        for i in rows:
            out.loc[i, cols] = keyed.loc[(out.at[i, "layer"], out.at[i, "tensor"], base), cols].to_numpy(dtype=float)
    return out, {"layers": slid, "schemes": priced_as}


def extrapolation_error(table, shorter: dict, reads: str, profile_len: int) -> dict | None:
    """Per scheme: the profile's summed KL at its own length over the KL extrapolated there from the longest
    shorter length it also profiled (None: no shorter length)."""
    if not shorter:
        return None
    length = max(shorter)
    short = shorter[length]
    out = {}
    for s in dict.fromkeys(table.scheme):
        f = scale(s, reads, length, profile_len) if needed_len(s, reads) <= length else math.inf
        a = short[short.scheme == s]
        b = table[table.scheme == s]
        if not len(a) or not math.isfinite(f):
            continue
        predicted = float(a.kl.sum()) * f
        if predicted > 0:
            out[s] = round(float(b.kl.sum()) / predicted, 4)
    return {"from_len": length, "to_len": profile_len, "measured_over_extrapolated": out}


def priced_at(table, reads: str, profile_len: int, n: int, layers: list[dict] | None = None):
    """The table's end-to-end damage as a cache read `reads` would take it at n tokens (validate's prediction);
    with the profile's `layers`, sink schemes on slid sliding-window layers as `price` takes them."""
    scales = {s: (scale(s, reads, profile_len, n) if needed_len(s, reads) <= profile_len else math.nan)
              for s in dict.fromkeys(table.scheme)}
    out = table.copy()
    factor = out.scheme.map(scales).astype(float)
    for col in PRICED_COLUMNS:
        if col in out:
            out[col] = out[col] * factor
    return sinkless_pricing(out, layers, profile_len, n)[0] if layers else out
