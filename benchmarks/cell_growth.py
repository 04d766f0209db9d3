"""Single cells measured at the profile's length and longer, against what the profile prices them at: does one
layer's K (or V) in one scheme cost at N tokens what the pricing rule says? Each cell is measured alone (every
other layer unquantized) on windows neither the profile nor `validate` uses (the `--select-measured` windows of
the profile's text, seed + 2); at the profile's length on every profile-length chunk of them.

    python benchmarks/cell_growth.py PROFILE_DIR --cells 8:K:int3_c32_r32_s4,8:K:int2_c32 [--model M]
                                     [--lengths 256,1024] [--windows 2]

"priced" is the pricing rule without the sliding-window correction (the share of positions that read something
quantized), "as planned" with it (sensprof.planning.pricing.sinkless_pricing: a sink scheme on a sliding layer the cache
slides past costs its sinkless scheme there), which is what the planner and `validate` use.
"""

from __future__ import annotations

import argparse


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("profile")
    ap.add_argument("--cells", required=True, help="LAYER:TENSOR:SCHEME,...")
    ap.add_argument("--model", default=None)
    ap.add_argument("--lengths", default=None, help="default: the profile's and 4x it")
    ap.add_argument("--windows", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    from sensprof.planning.budget import Budget
    from sensprof.data import bos_prefix
    from sensprof.models import load_model
    from sensprof.planning.plan import make_plan
    from sensprof.planning.pricing import priced_at
    from sensprof.planning.selection import selection_windows, short_chunks
    from sensprof.profiling.table import load_profile
    from sensprof.validation.validate import layer_choices, measure

    profile = load_profile(args.profile, require_complete=True)
    meta = profile.meta
    own = int(meta["settings"]["seq_len"])
    reads = meta.get("reads", "streaming")
    lengths = [int(x) for x in args.lengths.split(",")] if args.lengths else [own, 4 * own]
    cells = [(int(a), t, s) for a, t, s in (c.split(":") for c in args.cells.split(","))]
    template = make_plan(args.profile, "sensprof", Budget("avg_bits", 8))  # its layers and profile reference only
    configs = {}
    for layer, tensor, scheme in cells:
        pairs = [("none", "none")] * len(template.layers)
        pairs[layer] = (scheme, "none") if tensor == "K" else ("none", scheme)
        configs[f"L{layer} {tensor} {scheme}"] = layer_choices(template, pairs)
    loaded = load_model(args.model or meta["model"]["id"], args.device)
    longest = max(lengths)
    ids, _ = selection_windows(loaded.tokenizer, template, args.windows, longest)
    prefix = len(bos_prefix(loaded.tokenizer))
    kind = {info["index"]: (info["kind"], info.get("window")) for info in meta["layers"]}
    print(f"{'tokens':>6} {'cell':<28} {'layer kind':<14} {'windows':>7} {'measured':>10} {'priced':>10} "
          f"{'meas/pri':>8} {'as planned':>10} {'meas/plan':>9}")
    for n in lengths:
        x = ids if n == longest else short_chunks(ids, n, prefix)
        measured = measure(loaded.model, x, configs, reads=reads)
        plain = priced_at(profile.table, reads, own, n).set_index(["layer", "tensor", "scheme"]).kl
        planned = priced_at(profile.table, reads, own, n, meta["layers"]).set_index(["layer", "tensor", "scheme"]).kl
        for (layer, tensor, scheme), name in zip(cells, configs):
            m = measured[name]["kl"]
            p, q = float(plain[(layer, tensor, scheme)]), float(planned[(layer, tensor, scheme)])
            k, w = kind[layer]
            print(f"{n:>6} {name:<28} {k + (f' {w}' if w else ''):<14} {x.shape[0]:>7} {m:>10.3e} {p:>10.3e} "
                  f"{m / p:>8.2f} {q:>10.3e} {m / q:>9.2f}", flush=True)


if __name__ == "__main__":
    main()
