"""A plan with and without 4 sink tokens and 32 recent tokens kept on every grouped layer (uniforms.keep_recent, what
`plan --select-measured` also tries), measured on the same windows of a text of your choice, read streaming.

    python benchmarks/recent_tokens.py PLAN --text FILE_OR_FOLDER [--seq-len 1024] [--windows 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("plan")
    ap.add_argument("--text", action="append", required=True)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=3)
    args = ap.parse_args()

    from sensprof.artifacts import load_plan
    from sensprof.models import load_for_plan
    from sensprof.planning.uniforms import keep_recent
    from sensprof.validation.validate import measure, plan_reads, read_user_text, validation_windows

    plan = load_plan(args.plan)
    loaded = load_for_plan(plan, None, "cpu", None, None, False)
    text = read_user_text(plan.profile.settings.get("text_digest"), args.text)
    ids = validation_windows(plan, loaded.tokenizer, args.windows, args.seq_len, text)  # validate --text's windows
    kept = [dataclasses.replace(p, k_scheme=keep_recent(p.k_scheme), v_scheme=keep_recent(p.v_scheme))
            for p in plan.layers]
    t0 = time.time()
    measured = measure(loaded.model, ids, {"plan": list(plan.layers), "plan + sinks and 32 recent tokens": kept},
                       reads=plan_reads(plan))
    for name, m in measured.items():
        print(f"{name:<36} KL {m['kl']:.3e}  dPPL {m['dppl']:.4f}")
    print(f"{ids.shape[0]} x {ids.shape[1]} tokens of {text.name}, {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
