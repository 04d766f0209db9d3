"""What `sensprof schemes` prints: every registered scheme with its storage cost and the default menus, and with
--target vllm, vLLM's KV-cache dtypes (engines/vllm/catalog.py) priced by the same formula (memory.py)."""

from __future__ import annotations

from .engines.vllm.catalog import DTYPES, GPU_NAMES, OTHER_DTYPES, VllmDtype, check_vllm_gpu
from .memory import bits_per_element
from .schemes import REGISTRY, get_scheme, parse_menu


def describe_schemes() -> str:
    """`sensprof schemes`: every registered scheme with its cost, and the default menus with theirs."""
    lines = [f"{'scheme':<26}{'bits/elt (head_dim 64)':>24}{'bits/elt (128)':>16}  description"]
    for s in REGISTRY.values():
        lines.append(f"{s.name:<26}{bits_per_element(s, 64):>24.3f}{bits_per_element(s, 128):>16.3f}  {s.description}")
    lines.append("\nmodifiers: _pre (keys before RoPE), _r<R> (R most recent tokens in full precision), "
                 "_s<S> (S first tokens in full precision), e.g. int4_c32_pre_r128; engine formats take none")
    menu = parse_menu()
    for label, schemes in (("key", menu.k), ("value", menu.v)):
        listed = ", ".join(f"{s.name} ({bits_per_element(s, 64):.3g})" for s in schemes)
        lines.append(f"\ndefault {label} menu (--{label[0]}-schemes), bits/elt at head_dim 64: {listed}")
    return "\n".join(lines)


def _bits_text(scheme: str, d: VllmDtype) -> str:
    out = []
    for h in (64, 128):
        out.append("-" if d.head_dim_problem(h, "blackwell") else f"{bits_per_element(get_scheme(scheme), h):.2f}")
    return "/".join(out)


def describe_dtypes(gpu: str | None = None, head_dim: int = 128) -> str:
    """The table `sensprof schemes --target vllm` prints."""
    gpus = [check_vllm_gpu(gpu)] if gpu else list(GPU_NAMES)
    lines = ["vLLM 0.33 --kv-cache-dtype values (bits/element incl. scales, as vLLM allocates; head_dim 64 / 128)",
             f"{'dtype':<22}{'K bits':>14}{'V bits':>14}  {'since':<6} {'runs on':<30} K / V schemes; notes"]
    for d in DTYPES:
        k, v = d.k_scheme, d.v_scheme
        kb, vb = _bits_text(k, d), _bits_text(v, d)
        runs = ",".join(g for g in gpus if g in d.gpus) or "-"
        notes = [f"{k} / {v}"]
        if d.needs_scales:
            notes.append("calibrated k_scale/v_scale (--write-checkpoint)")
        if d.boundary_skip:
            notes.append(f"vLLM keeps the first and last {d.boundary_skip} layers")
        variants = {g: s for g, s in d.k_scheme_on.items() if g in gpus}
        if variants:
            notes.append("keys on " + ", ".join(f"{g}: {s}" for g, s in variants.items()))
        if d.head_dims != "any":
            notes.append(d.head_dim_problem(96, "hopper") or d.head_dim_problem(64, "hopper") or "")
        off = [g for g in gpus if g not in d.gpus]
        why = dict(d.facts.excluded)
        reasons: dict[str, list[str]] = {}
        for g in off:
            reasons.setdefault(why.get(g, "not served there"), []).append(g)
        notes += [f"not on {','.join(gs)}: {r}" for r, gs in reasons.items()]
        notes.append(f"checked: {d.checked}")
        lines.append(f"{d.flag_value + (' (cal)' if d.needs_scales else ''):<22}{kb:>14}{vb:>14}  {d.since or 'any':<6} "
                     f"{runs:<30} {'; '.join(notes)}")
    lines.append("not offered: " + "; ".join(f"{k} ({v})" for k, v in OTHER_DTYPES.items()))
    return "\n".join(lines)
