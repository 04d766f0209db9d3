"""Every uniform configuration a target can express: the baselines a plan is judged against.

A uniform configuration gives every layer one K scheme and one V scheme, so it needs no profile cells: it is
measured directly (sensprof.validation.baselines). The free target (sensprof's runtime) stores any format of the
registry, not only the profile's menus: keys per channel over 32/64/128-token groups (after RoPE, and before it
where every layer has RoPE: per channel before RoPE beat after it at every budget on Gemma 3 270M), values per token
over 32/64/128-channel groups, 2 to 8 bits, each plain, with 4 sink tokens, or with 4 sink tokens and a 32-token
residual window (a model whose values need sinks but no recent window pays 32 tokens less); fp8 and int8 per
token-head; either tensor left unquantized. Within a budget most of those are beaten by construction: one
that fits beside a configuration of the same layouts with at least as many bits, groups no larger and at least as many
full-precision sink and recent tokens on both tensors is never the one to beat (quantization error only shrinks
along each of those), so only the maximal configurations are kept (`maximal`), a few dozen at most; a short
measurement ranks them. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SensprofError
from ..schemes import get_scheme

BITS = (2, 3, 4, 5, 6, 8)
GROUPS = (32, 64, 128)
KEPT_RECENT = "_r32_s4"  # 4 sink tokens and a 32-token residual window in full precision: what keep_recent adds
EXTRAS = ("", "_s4", KEPT_RECENT)  # keys and values alike: plain, 4 sinks, 4 sinks and 32 recent tokens
PER_TOKEN_HEAD = ("fp8_e4m3", "fp8_e5m2", "int8_per_token_head")


@dataclass(frozen=True)
class Uniform:
    """One K and one V scheme on every layer, and what it costs in the budget's unit."""

    k: str
    v: str
    cost: float
    flag: str = ""  # a per-layer vLLM dtype (plan --per-layer): the dtype every layer takes, as the plan names it

    @property
    def label(self) -> str:
        return self.flag or f"{self.k} / {self.v}"

    @property
    def name(self) -> str:
        return f"uniform {self.label}"


def key_schemes(head_dims, pre_rope: bool = False) -> list[str]:
    """Every key scheme the free target stores: per channel (KIVI keys), and with `pre_rope` (a model whose every
    layer has RoPE) per channel before RoPE too (KVQuant keys), per token-head, or none."""
    where = ("", "_pre") if pre_rope else ("",)
    return ["none", *PER_TOKEN_HEAD,
            *(f"int{b}_c{g}{p}{e}" for b in BITS for g in GROUPS for p in where for e in EXTRAS)]


def value_schemes(head_dims) -> list[str]:
    """Every value scheme the free target stores: per token over channel groups no wider than the narrowest head
    (a wider one is that head's width again: under 32 channels, the 32-channel group is the head's), per token-head,
    or none."""
    narrowest = min(head_dims)
    groups = [g for g in GROUPS if g <= narrowest] or [min(GROUPS)]
    return ["none", *PER_TOKEN_HEAD, *(f"int{b}_t{g}{e}" for b in BITS for g in groups for e in EXTRAS)]


def at_least_as_precise(a: str, b: str) -> bool:
    """Scheme a loses no more than b by construction: unquantized, or the same layout with at least as many bits,
    groups no larger and at least as many sink and residual tokens."""
    if a == b or a == "none":
        return True
    if b == "none":
        return False
    sa, sb = get_scheme(a), get_scheme(b)
    layout = ("format", "granularity", "codec", "scale_source", "pre_rope")
    if any(getattr(sa, f) != getattr(sb, f) for f in layout):
        return False
    return (sa.bits >= sb.bits and (sa.group or 0) <= (sb.group or 0) and sa.residual >= sb.residual
            and sa.sink >= sb.sink)


def within_budget(budget, layers: list[dict], limit: float | None = None, pre_rope: bool = False) -> list[Uniform]:
    """Every uniform configuration of the free target that costs no more than `limit` (default the budget's), the
    all-unquantized one left out; keys before RoPE with `pre_rope` (every layer has RoPE)."""
    limit = budget.limit(layers) if limit is None else limit
    dims = {layer["head_dim"] for layer in layers}
    keys, values = key_schemes(dims, pre_rope), value_schemes(dims)
    cost = {}
    for tensor, names in (("K", keys), ("V", values)):
        for name in names:
            s = get_scheme(name)
            cost[tensor, name] = sum(budget.cost(s, layer) for layer in layers)
    out = [Uniform(k, v, cost["K", k] + cost["V", v]) for k in keys for v in values
           if (k, v) != ("none", "none") and cost["K", k] + cost["V", v] <= limit * (1 + 1e-9)]
    return out


def maximal(configs: list[Uniform]) -> list[Uniform]:
    """The configurations no other one in the list is at least as precise as on both tensors (see the module's
    docstring), cheapest first."""
    keep = [c for c in configs if not any(
        (o.k, o.v) != (c.k, c.v) and at_least_as_precise(o.k, c.k) and at_least_as_precise(o.v, c.v)
        for o in configs)]
    return sorted(keep, key=lambda c: (c.cost, c.k, c.v))


def candidates(budget, layers: list[dict], limit: float | None = None, pre_rope: bool = False) -> list[Uniform]:
    """The uniform configurations worth measuring within the budget (or `limit`): the maximal ones."""
    found = maximal(within_budget(budget, layers, limit, pre_rope))
    if not found:
        raise SensprofError("no uniform configuration fits the budget; raise it (e.g. --avg-bits 4)")
    return found


def per_layer_candidates(dtypes, budget, layers: list[dict], limit: float | None = None) -> list[Uniform]:
    """Each dtype a per-layer vLLM plan may give a layer (targets.get_target(..., per_layer=True).dtypes: vLLM's own
    and the plugin's K/V pairs), alone on every layer, within the budget (or `limit`): the maximal ones. Every layer
    one dtype is a plan the plugin serves as it is priced (no layer's pages differ, so vLLM pads none)."""
    limit = budget.limit(layers) if limit is None else limit
    found = []
    for d in dtypes:
        if (d.k_scheme, d.v_scheme) == ("none", "none"):
            continue
        cost = budget.layers_cost([(d.k_scheme, d.v_scheme)] * len(layers), layers)
        if cost <= limit * (1 + 1e-9):
            found.append(Uniform(d.k_scheme, d.v_scheme, cost, d.flag_value))
    found = maximal(found)
    if not found:
        raise SensprofError("no per-layer vLLM dtype fits the budget on every layer; raise it (e.g. --avg-bits 8)")
    return found


def keep_recent(name: str) -> str:
    """The scheme with 4 sink tokens and a 32-token residual window kept in full precision (`_r32_s4`), where it is a
    grouped integer scheme that keeps none yet; otherwise the scheme itself."""
    if name == "none":
        return name
    s = get_scheme(name)
    if s.format != "int" or s.group is None or s.residual or s.sink or s.is_engine:
        return name
    return name + KEPT_RECENT


def kept_recent_base(name: str) -> str | None:
    """The scheme `keep_recent` made `name` from; None where it made none. A profile rarely holds the `_r32_s4`
    variant of every scheme it measured, and kept tokens only remove error, so the base's cell bounds the missing
    one from above: a plan with such schemes (selection's "+ sinks and 32 recent tokens") still has a sum to print."""
    if not name.endswith(KEPT_RECENT):
        return None
    base = name.removesuffix(KEPT_RECENT)
    try:
        return base if keep_recent(base) == name else None
    except SensprofError:  # not a scheme this version knows
        return None


def before_rope(name: str) -> str:
    """The key scheme stored before RoPE (`_pre`, in the name grammar's place: after the base, before `_r`/`_s`):
    per-channel integer keys only (KVQuant's); any other scheme, or one already before RoPE, is itself."""
    if name == "none":
        return name
    s = get_scheme(name)
    if s.pre_rope or s.format != "int" or s.granularity != "channel" or s.is_engine or s.rotation:
        return name
    tail = (f"_r{s.residual}" if s.residual else "") + (f"_s{s.sink}" if s.sink else "")
    return name.removesuffix(tail) + "_pre" + tail


def after_rope(name: str) -> str | None:
    """The twin after RoPE of a key scheme stored before it; None for any other scheme."""
    if name == "none" or not get_scheme(name).pre_rope:
        return None
    return name.replace("_pre", "", 1)


def bounded_scheme(name: str, measured) -> str:
    """The scheme whose cell prices `name`: itself where `measured(name)`; else the base `keep_recent` made it from
    (kept_recent_base), an upper bound (kept tokens only remove error); else, for keys before RoPE, the same tried on
    their twin after RoPE (`after_rope`: an estimate, not a bound, which the selection's measurement and joint factor
    correct); else itself (no cell: the caller's missing value). Shared by the selection's sums (a damage dict) and
    validate's plan row (a profile table)."""
    twin = after_rope(name)
    for candidate in (name, twin):
        if candidate is None:
            continue
        if measured(candidate):
            return candidate
        base = kept_recent_base(candidate)
        if base is not None and measured(base):
            return base
    return name


def rank(configs: list[Uniform], k_damage: dict[str, float], v_damage: dict[str, float], top: int) -> list[Uniform]:
    """The `top` configurations of least summed damage (each tensor's measured alone: damage adds across K and V to
    first order, as the planner's sum assumes), ties to the cheaper."""
    return sorted(configs, key=lambda c: (k_damage.get(c.k, 0.0) + v_damage.get(c.v, 0.0), c.cost))[:top]
