"""Plain-text summaries of a profile for the terminal."""

from __future__ import annotations


def _fmt(x: float) -> str:
    return f"{x:.2e}"


def reference_scheme(table) -> str | None:
    """A scheme profiled for K and V, else a key and a value scheme of equal bits ('K / V'); None if neither."""
    from .errors import SensprofError
    from .report.data import pick_reference_scheme

    try:
        return pick_reference_scheme(table)
    except SensprofError:
        return None


def length_table(profile) -> str:
    """Damage vs context length: each scheme's KL summed over layers (a uniform configuration's prediction)."""
    from .report.data import damage_by_length

    df = damage_by_length(profile)
    if df.empty:
        return ""
    lens = sorted(set(df.seq_len))
    kl = df.set_index(["tensor", "scheme", "seq_len"]).kl_sum
    lines = ["", "damage vs context length: KL summed over layers, per tensor and scheme (the planner uses the "
             f"longest, {lens[-1]})", f"{'tensor':<7}{'scheme':<22}" + "".join(f"{n:>12}" for n in lens)]
    longest = df[df.seq_len == lens[-1]]
    for tensor, scheme in zip(longest.tensor, longest.scheme):
        vals = [_fmt(kl[(tensor, scheme, n)]) if (tensor, scheme, n) in kl.index else "-" for n in lens]
        lines.append(f"{tensor:<7}{scheme:<22}" + "".join(f"{v:>12}" for v in vals))
    return "\n".join(lines)


def summarize(profile, max_layers: int = 64) -> str:
    t, meta = profile.table, profile.meta
    layers = meta["layers"]
    kinds = {k: sum(1 for i in layers if i["kind"] == k) for k in ("full", "sliding")}
    head = layers[0]
    lines = [
        f"profile of {meta['model']['id']} (fingerprint {meta['model']['fingerprint']}): {len(layers)} layers "
        f"({kinds['full']} full, {kinds['sliding']} sliding), {head['kv_heads']} KV heads x {head['head_dim']}, "
        f"{meta['token_count']} tokens, {len(meta['schemes'])} schemes, "
        f"layers done {len(meta.get('layers_done', []))}/{len(layers)}, wall time {meta.get('wall_time_s', 0):.0f} s",
        "",
        "damage = mean per-token KL(baseline || quantized) of the next-token distribution, one tensor of one layer at a time",
        f"{'scheme':<22}{'bits':>6}{'mean KL K':>12}{'mean KL V':>12}{'K/V':>7}  most fragile K layers | V layers",
    ]
    if t.empty:
        return "\n".join(lines + ["(no layers profiled yet)"])
    if not t.measured.all():
        lines.insert(1, f"screened (--screen): {int(t.measured.sum())} of {len(t)} cells measured end to end, every "
                        "cell on a layer's bits-vs-KL hull among them; the others' KL is predicted from their local error")
    for scheme in t.scheme.unique():
        s = t[t.scheme == scheme]
        k, v = s[s.tensor == "K"], s[s.tensor == "V"]
        kmean = k.kl.mean() if len(k) else float("nan")
        vmean = v.kl.mean() if len(v) else float("nan")
        ratio = f"{kmean / vmean:7.2f}" if len(k) and len(v) and vmean > 0 else f"{'-':>7}"
        top_k = ",".join(str(x) for x in k.nlargest(3, "kl").layer) or "-"
        top_v = ",".join(str(x) for x in v.nlargest(3, "kl").layer) or "-"
        lines.append(f"{scheme:<22}{s.bits.iloc[0]:>6.2f}{_fmt(kmean) if len(k) else '-':>12}"
                     f"{_fmt(vmean) if len(v) else '-':>12}{ratio}  {top_k} | {top_v}")
    ref = reference_scheme(t)
    if ref is not None:
        from .report.data import split_reference

        ks, vs = split_reference(ref)
        r = t[((t.tensor == "K") & (t.scheme == ks)) | ((t.tensor == "V") & (t.scheme == vs))]
        stats = profile.stats
        lines += ["", f"per layer at {ref}: KL of K, KL of V, and key channel outlier ratio (max/median) post/pre RoPE",
                  f"{'layer':>5} {'kind':<8}{'KL K':>10}{'KL V':>10}{'K/V':>7}{'out K':>8}{'out Kpre':>9}"]
        for layer in sorted(r.layer.unique())[:max_layers]:
            k = r[(r.layer == layer) & (r.tensor == "K")].kl
            v = r[(r.layer == layer) & (r.tensor == "V")].kl
            st = stats[stats.layer == layer]
            ok = st[st.tensor == "K"].outlier_ratio
            op = st[st.tensor == "K_pre"].outlier_ratio
            kk, vv = float(k.iloc[0]), float(v.iloc[0])
            lines.append(f"{layer:>5} {layers[layer]['kind']:<8}{_fmt(kk):>10}{_fmt(vv):>10}"
                         f"{(kk / vv if vv > 0 else float('nan')):>7.2f}"
                         f"{(float(ok.iloc[0]) if len(ok) else float('nan')):>8.1f}"
                         f"{(float(op.iloc[0]) if len(op) else float('nan')):>9.1f}")
    return "\n".join(lines) + length_table(profile)
