"""Rows for sensprof/planning/prediction_checks.csv from what `sensprof validate` wrote for a plan: the plan row of
each length of its validation CSV (or an engine's CSV), with the plan's own joint factors, and llama.cpp's numerics
floor where the engine's CSV measured it. No model is loaded.

    python benchmarks/prediction_check_rows.py plans/smollm2-135m-sensprof-5bits.json [--csv FILE] [--windows N]

--csv defaults to the plan's `.validation.csv`; --windows to the profile's (what validate measures on by default).
Paste the rows into the checks file in place of the plan's earlier ones (rename those: they measured another plan).
"""

from __future__ import annotations

import argparse
import os
import sys

import pandas as pd

from sensprof.artifacts import load_plan
from sensprof.planning import prediction as P
from sensprof.planning.pricing import target_reads


def rows(plan_path: str, csv_path: str, windows: int) -> list[str]:
    plan = load_plan(plan_path)
    df = pd.read_csv(csv_path)
    plan_rows = df[df.config == "plan"]
    if plan_rows.empty:
        raise SystemExit(f"{csv_path} has no plan row; pass the CSV `sensprof validate {plan_path}` wrote")
    pricing = plan.predicted.pricing or {}
    reads = pricing.get("reads") or target_reads(plan.target)  # as prediction.for_plan reads it
    profile_len = int(pricing.get("profile_len") or plan.profile.settings["seq_len"])
    kind = P.engine_kind(plan.target, getattr(plan.engine, "vllm_gpu", None))
    joint = " ".join(f"{n}:{f:g}" for n, f in (plan.predicted.joint_factor or {}).items())
    measured = "engine_kl" if "engine_kl" in df else "measured_kl"
    name = os.path.splitext(os.path.basename(plan_path))[0]
    out = []
    for r in plan_rows.itertuples():
        total = getattr(r, "per_layer_sum", float("nan"))
        if not total == total:  # an engine's table: the plan's own KL sum (the all regime prices it alike at any n)
            total = P.kl_sum(plan)
        out.append(f"{name},{plan.model_id},{kind},{reads},{profile_len},{int(r.seq_len)},{windows},{total:.6g},"
                   f"{joint},{getattr(r, measured):.6g},{os.path.relpath(csv_path)}")
        floor = getattr(r, "engine_floor_kl", float("nan"))
        if kind == "llamacpp" and floor == floor:  # llama.cpp's own floor, measured beside the plan (prediction.floor_at reads these)
            out.append(f"llamacpp floor,{plan.model_id},llamacpp-floor,{reads},{profile_len},{int(r.seq_len)},"
                       f"{windows},,,{floor:.6g},{os.path.relpath(csv_path)} (engine_floor_kl)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plan")
    ap.add_argument("--csv", help="validate's CSV (default: <plan>.validation.csv)")
    ap.add_argument("--windows", type=int, help="windows validate measured on (default: the profile's)")
    a = ap.parse_args()
    csv_path = a.csv or os.path.splitext(a.plan)[0] + ".validation.csv"
    windows = a.windows or int(load_plan(a.plan).profile.settings.get("windows") or 2)
    sys.stdout.write("\n".join(rows(a.plan, csv_path, windows)) + "\n")


if __name__ == "__main__":
    main()
