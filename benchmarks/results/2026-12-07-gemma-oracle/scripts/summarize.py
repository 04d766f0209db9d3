"""As run: python summarize.py judged.csv: each plan over its budget's uniform setting on the 4 windows the oracle
profile read (slots 0, 9, 11, 13), on the other 4 and on all 8 (the README table's figure), with the lead in paired
standard errors over 8 blocks a window (selection.paired_standard_error's rule)."""
import math
import sys

import pandas as pd

READ = {0, 9, 11, 13}
t = pd.read_csv(sys.argv[1])
blocks, windows = t[t.block.notna()], t[t.block.isna()]
uniform_config = dict(windows[windows.kind == "uniform"].groupby("bits").config.first())
uniform = blocks[blocks.kind == "uniform"].set_index(["bits", "slot", "block"]).kl
print(f"{'bits':>4} {'plan':<40} {'read 4':>14} {'other 4':>14} {'all 8':>14}")
for (b, config), g in blocks[blocks.kind == "plan"].groupby(["bits", "config"], sort=False):
    cells = []
    read = g.slot.isin(READ)
    for sel in (g[read], g[~read], g):
        u = uniform.loc[[(b, s, k) for s, k in zip(sel.slot, sel.block)]].to_numpy()
        d = sel.kl.to_numpy() - u
        se = d.std(ddof=1) / math.sqrt(len(d))
        slots = set(sel.slot)  # the ratio of whole-window means, as plans_by_kind prints it; the lead from blocks
        mine, theirs = (windows[(windows.bits == b) & (windows.config == c) & windows.slot.isin(slots)].kl.mean()
                        for c in (config, uniform_config[b]))
        cells.append(f"{mine / theirs:.3f} ({-d.mean() / se:+.1f})")
    print(f"{b:>4} {config[-40:]:<40} {cells[0]:>14} {cells[1]:>14} {cells[2]:>14}")
for b, g in windows.groupby(["bits", "kind", "config"]):
    print(f"{b[0]:>4} {b[1]:<7} {b[2][-40:]:<40} KL {g.kl.mean():.3e} on all 8 windows, {g.bits_held.iloc[0]:.3f} bits held")
