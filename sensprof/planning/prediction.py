"""The damage a plan is printed with, at the length it serves, and how far what was measured fell from it (no torch).

A plan holds its per-layer sum (priced at its serving length, `pricing.py`) and, when `plan --select-measured` chose
it, the joint factor measured/sum at one or two lengths. What the engine measures at the serving length differs from
that sum in three ways, each measured and recorded in `prediction_checks.csv` beside this module (one row per plan,
engine and length; docs/plan-quality.md, "Printed predictions against the engines", has the commands):

- the layers' interaction: the joint factor, where the selection measured one;
- growth with context in the `all` regime: an engine reads every cached token quantized, and the damage per
  position grows with how much of the past is quantized, which the pricing rule (constant damage per moved position)
  does not carry: the per-token dtypes are priced at scale 1. The prediction grows as (n / m) ** g from the
  longest length m a factor was measured at (the profile's length when none was), g the median of the growth
  exponents measured between two lengths of the same configuration in the checks, for that model on that engine
  where it has enough of them, else on that engine (`growth_exponent`);
- llama.cpp's numerics: its matmuls round their inputs, and any change to the cache costs a floor of KL of its own
  (docs/engines.md), measured per model and added where the model's floor is recorded.

Then the bands: for each kind of engine, the measured KL over this very prediction on every recorded check, so that
a printed figure says how far such figures fell from what was measured (`ServingPrediction.describe`): one over
held-out windows of the profile's own kind of text, one over text of another kind (a user's own text often is).
The second reaches higher (1.70x for sensprof's runtime, against 1.14x): a profile prices each layer on its own text,
and the layers' interaction it measured there (the joint factor) need not hold on other text.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import statistics
from dataclasses import dataclass
from functools import lru_cache

from ..errors import SensprofError
from .pricing import DEFAULT_CONTEXT_LEN, target_reads

CHECKS_FILE = os.path.join(os.path.dirname(__file__), "prediction_checks.csv")
DOC = "docs/plan-quality.md#printed-predictions-against-the-engines"
TOLERANCE = 0.25  # issue 38: a printed prediction within +-25% of what is measured, or printed with its band
KINDS = {  # what measured the checks of each kind of plan
    "sensprof": "sensprof's runtime (validate)",
    "vllm-cpu": "vLLM's CPU backend",
    "vllm-gpu": "sensprof's emulation of vLLM's GPU kernels (no GPU engine was run)",
    "llamacpp": "llama.cpp",
    "sglang": "SGLang",
}
TEXT_KINDS = {"same": "held-out text of the profile's kind", "other": "text of another kind"}
COLUMNS = ("id", "model", "kind", "reads", "profile_len", "seq_len", "windows", "text_kind", "per_layer_sum",
           "joint_factor", "measured_kl", "source")


@dataclass(frozen=True)
class Check:
    """One measurement: a configuration's KL at one length, beside what its plan held (per_layer_sum: the plan's sum
    priced at that length; None for a configuration measured only for its growth with context); text_kind: on
    held-out text of the profile's kind ("same") or on text of another kind ("other")."""

    id: str
    model: str
    kind: str
    reads: str
    profile_len: int
    seq_len: int
    windows: int
    per_layer_sum: float | None
    joint_factor: dict | None
    measured_kl: float
    source: str
    text_kind: str = "same"


def parse_joint(text: str) -> dict | None:
    """'256:1.02 1024:1.16' -> {'256': 1.02, '1024': 1.16}; '' -> None."""
    if not text.strip():
        return None
    out = {}
    for part in text.split():
        n, _, f = part.partition(":")
        try:
            out[str(int(n))] = float(f)
        except ValueError:
            raise ValueError(f"joint_factor {text!r} is not 'TOKENS:FACTOR ...'") from None
    return out


def read_checks(path: str = CHECKS_FILE) -> tuple[Check, ...]:
    """The recorded checks ('#' lines are comments); a damaged file is one line naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            rows = list(csv.DictReader(line for line in f if line.strip() and not line.startswith("#")))
    except OSError as e:
        raise SensprofError(f"cannot read the prediction checks {path!r} ({e.strerror}); reinstall sensprof") from None
    out = []
    for i, r in enumerate(rows, 2):
        try:
            if set(COLUMNS) - set(r):
                raise ValueError(f"missing columns {sorted(set(COLUMNS) - set(r))}")
            c = Check(r["id"], r["model"], r["kind"], r["reads"], int(r["profile_len"]), int(r["seq_len"]),
                      int(r["windows"]), float(r["per_layer_sum"]) if r["per_layer_sum"].strip() else None,
                      parse_joint(r["joint_factor"]), float(r["measured_kl"]), r["source"], r["text_kind"])
            if c.kind not in KINDS and c.kind != "llamacpp-floor" or c.reads not in ("streaming", "all"):
                raise ValueError(f"kind {c.kind!r} / reads {c.reads!r}")
            if c.text_kind not in TEXT_KINDS:
                raise ValueError(f"text_kind {c.text_kind!r} is not one of {', '.join(TEXT_KINDS)}")
            if not (c.measured_kl > 0 and math.isfinite(c.measured_kl)) or c.seq_len <= 0 or c.profile_len <= 0:
                raise ValueError("measured_kl, seq_len and profile_len must be positive")
        except (ValueError, TypeError, KeyError) as e:
            raise SensprofError(f"{path!r}, check {i}: {e}; reinstall sensprof") from None
        out.append(c)
    return tuple(out)


@lru_cache(maxsize=4)
def _checks(path: str) -> tuple[Check, ...]:
    """The installed checks; none where the file is not installed (a figure then prints without a band)."""
    return read_checks(path) if os.path.exists(path) else ()


MIN_PAIRS = 3  # a model's (else a kind's) own growth where it has this many pairs of lengths measured


def growth_pairs(checks, model: str | None = None) -> dict[str, list[float]]:
    """Per kind, log(KL(n2) / KL(n1)) / log(n2 / n1) between consecutive lengths of each configuration measured at
    two or more lengths in the `all` regime (one model's only, where `model` is given)."""
    by_id: dict[tuple, dict[int, float]] = {}
    for c in checks:
        if c.reads == "all" and c.kind in KINDS and model in (None, c.model):
            by_id.setdefault((c.model, c.id, c.kind), {})[c.seq_len] = c.measured_kl
    out: dict[str, list[float]] = {}
    for (_, _, kind), lengths in by_id.items():
        ns = sorted(lengths)
        out.setdefault(kind, []).extend(math.log(lengths[b] / lengths[a]) / math.log(b / a) for a, b in zip(ns, ns[1:]))
    return out


def growth_exponent(checks, kind: str | None = None, model: str | None = None) -> float:
    """How damage grows with context in the `all` regime: the median of `growth_pairs`, that model's on that kind
    where it has MIN_PAIRS of them (models differ: Gemma 3's sliding-window layers barely grow), else the kind's own
    where it has as many (engines differ: llama.cpp's numerics floor does not grow), else every kind's; 0 with none."""
    pairs = growth_pairs(checks)
    for own in ((growth_pairs(checks, model).get(kind, []) if kind and model else []),
                (pairs.get(kind, []) if kind else [])):
        if len(own) >= MIN_PAIRS:
            return statistics.median(own)
    slopes = [g for v in pairs.values() for g in v]
    return statistics.median(slopes) if slopes else 0.0


def floor_at(checks, model: str, n: int) -> float | None:
    """llama.cpp's numerics floor for this model, measured at the length nearest n (in log; the longer of two as
    near), the mean where several measurements (other windows, other days) share that length; None where unmeasured."""
    rows = [c for c in checks if c.kind == "llamacpp-floor" and c.model == model]
    if not rows:
        return None
    nearest = min(rows, key=lambda c: (abs(math.log(c.seq_len / n)), -c.seq_len)).seq_len
    at = [c.measured_kl for c in rows if c.seq_len == nearest]
    return sum(at) / len(at)


def engine_kind(target: str, vllm_gpu: str | None = None) -> str:
    if target == "vllm":
        return "vllm-cpu" if vllm_gpu == "cpu" else "vllm-gpu"
    if target not in KINDS:
        raise SensprofError(f"no prediction for target {target!r}; the targets are {', '.join(KINDS)}")
    return target


@dataclass(frozen=True)
class Band:
    lo: float  # measured / predicted, least and most
    hi: float
    count: int
    lengths: tuple[int, ...]
    kind: str
    same_selection: bool  # from checks of plans chosen as this one was (by measurement or not)
    text_kind: str = "same"


@dataclass(frozen=True)
class ServingPrediction:
    kl: float  # what the engine is predicted to measure at n tokens
    n: int
    per_layer_sum: float
    factor: float  # joint factor and growth with context, together
    factor_why: str
    floor: float  # llama.cpp's numerics floor added (0: none)
    kind: str
    band: Band | None
    emulated: bool = False  # llama.cpp's cache in sensprof's float32 emulation (validate without --engine): no floor
    unpriced: bool = False  # a streaming plan made before damage was priced at the serving length (no pricing record)
    with_spread: bool = False  # a --robust plan's sum, which adds each cell's spread, with no KL sum recorded
    other_text: Band | None = None  # the band measured on text of another kind than the profile's

    def describe(self) -> str:
        """One line: the figure, how it was made, and the band measured for such figures."""
        how = f"per-layer sum {self.per_layer_sum:.3e}"
        if abs(self.factor - 1) > 5e-3:
            how += f" x {self.factor:.2f} ({self.factor_why})"
        if self.floor:
            how += f" + llama.cpp's numerics floor {self.floor:.2e}"
        head = f"predicted KL {self.kl:.2e} at {self.n} tokens ({how})"
        if self.with_spread:
            head += " [the --robust objective's sum: each cell's KL plus its spread, so an upper figure]"
        if self.unpriced:
            head += (" [the sum is the profile's at its own length: the plan predates pricing at the serving length; "
                     "re-plan to price it]")
        b = self.band
        if self.emulated:
            return head + ("; sensprof's float32 emulation of llama.cpp's cache, which llama.cpp's own numerics add a "
                           "floor to: `validate --engine llamacpp` measures the engine")
        if b is None:
            return head + f"; not measured in {KINDS[self.kind]} yet, so no error band"
        which = ("such predictions" if b.same_selection else
                 "such predictions for plans chosen otherwise (none recorded chosen as this one)")
        line = head + f"; {KINDS[self.kind]} measured {self._range(b)} {which} on {self._where(b)}"
        if self.other_text is not None:
            o = self.other_text
            line += f", {self._range(o)}{'' if o.same_selection else ' (plans chosen otherwise)'} on {self._where(o)}"
        else:
            line += ", not yet measured on text of another kind"
        return line + f" ({DOC})"

    def _range(self, b: Band) -> str:
        return f"{b.lo:.2f}-{b.hi:.2f}x"

    def _where(self, b: Band) -> str:
        lens = "/".join(str(n) for n in b.lengths)
        return (f"{b.count} checks at {lens} tokens of {TEXT_KINDS[b.text_kind]}: "
                f"{self.kl * b.lo:.1e}..{self.kl * b.hi:.1e}")


def _point(per_layer_sum: float, kind: str, reads: str, profile_len: int, n: int, joint: dict, model: str,
           checks, engine: bool = True) -> tuple[float, float, str, float]:
    """(KL, factor, why, floor): the figure `predict` prints (module docstring)."""
    factor, why = 1.0, ""
    if joint:
        m = min(joint, key=lambda m: (abs(math.log(m / n)), -m))
        factor, why = joint[m], f"all layers at once measured at {m} tokens"
    start = max(joint) if joint else profile_len
    if reads == "all" and n > start:
        g = growth_exponent(checks, kind, model)
        factor *= (n / start) ** g
        why = ((why + " and " if why else "") + f"growth with context from {start} tokens, (n/{start})^{g:.2f}, the "
               "median measured in the all regime")
    floor = (floor_at(checks, model, n) or 0.0) if kind == "llamacpp" and engine else 0.0
    return per_layer_sum * factor + floor, factor, why, floor


def predict(per_layer_sum: float, *, kind: str, reads: str, profile_len: int, n: int, joint_factor: dict | None,
            model: str, checks=None, engine: bool = True) -> ServingPrediction:
    """What `kind` is predicted to measure at n tokens for a plan of this per-layer sum (priced at n), with the
    band measured for such predictions; module docstring. `checks`: the recorded checks (default:
    prediction_checks.csv); engine=False: what sensprof's float32 emulation measures (llama.cpp without its floor,
    and without a band: the checks are the engine's)."""
    checks = _checks(CHECKS_FILE) if checks is None else checks
    if kind not in KINDS:
        raise SensprofError(f"no prediction for {kind!r}; the kinds are {', '.join(KINDS)}")
    if not (per_layer_sum >= 0 and math.isfinite(per_layer_sum)) or n <= 0 or profile_len <= 0:
        raise SensprofError(f"no prediction from a per-layer sum of {per_layer_sum!r} at {n} tokens")
    joint = {int(k): float(v) for k, v in (joint_factor or {}).items()}
    kl, factor, why, floor = _point(per_layer_sum, kind, reads, profile_len, n, joint, model, checks, engine)
    emulated = kind == "llamacpp" and not engine
    bands = (None, None) if emulated else (band(checks, kind, bool(joint)), band(checks, kind, bool(joint), "other"))
    return ServingPrediction(kl, n, per_layer_sum, factor, why, floor, kind, bands[0], emulated,
                             other_text=bands[1])


def check_ratio(c: Check, checks) -> float:
    """A check's measured KL over what `predict` gives for it."""
    joint = {int(k): float(v) for k, v in (c.joint_factor or {}).items()}
    return c.measured_kl / _point(c.per_layer_sum, c.kind, c.reads, c.profile_len, c.seq_len, joint, c.model,
                                  checks)[0]


def band(checks, kind: str, selected: bool, text_kind: str = "same") -> Band | None:
    """measured / predicted over the checks of this kind on this kind of text: those of plans chosen as this one was
    (with a joint factor or without) where two or more are recorded, else all of the kind; None where none is."""
    mine = [c for c in checks if c.kind == kind and c.per_layer_sum is not None and c.text_kind == text_kind]
    same = [c for c in mine if bool(c.joint_factor) == selected]
    use = same if len(same) >= 2 else mine
    if not use:
        return None
    ratios = [check_ratio(c, checks) for c in use]
    return Band(min(ratios), max(ratios), len(use), tuple(sorted({c.seq_len for c in use})), kind, use is same,
                text_kind)


# ---------------------------------------------------------------- a plan's


def serving_len(plan) -> int:
    """The length a plan serves: the one its damage was priced at, else the pricing's default."""
    pricing = plan.predicted.pricing or {}
    return int(pricing.get("context_len") or plan.predicted.context_len or DEFAULT_CONTEXT_LEN)


def for_plan(plan, n: int | None = None, per_layer_sum: float | None = None,
             engine: bool = True) -> ServingPrediction | None:
    """The plan's prediction at n tokens (default its serving length); `per_layer_sum`: its sum priced at n where
    that differs from the plan's own (validate prices it from the profile); None for a plan optimised for another
    objective than KL (its sum is not a KL). engine=False: what sensprof's emulation measures (validate without
    --engine; differs for llama.cpp, whose numerics add a floor)."""
    p = plan.predicted
    if p.objective != "kl":
        return None
    n = serving_len(plan) if n is None else int(n)
    pricing = p.pricing or {}
    profile_len = int(pricing.get("profile_len") or plan.profile.settings.get("seq_len") or n)
    reads = pricing.get("reads") or target_reads(plan.target)
    total = kl_sum(plan) if per_layer_sum is None else per_layer_sum
    if reads == "streaming" and per_layer_sum is None and n != serving_len(plan):
        return None  # the streaming sum depends on the length; only validate (with the profile) prices it at n
    out = predict(total, kind=engine_kind(plan.target, getattr(plan.engine, "vllm_gpu", None)), reads=reads,
                  profile_len=profile_len, n=n, joint_factor=p.joint_factor, model=plan.model_id, engine=engine)
    if reads == "streaming" and not p.pricing and per_layer_sum is None:
        out = dataclasses.replace(out, unpriced=True)
    if per_layer_sum is None and plan.solver.robust and recorded_kl_sum(plan) is None:
        out = dataclasses.replace(out, with_spread=True)
    return out


def kl_sum(plan) -> float:
    """The plan's per-layer KL sum at its serving length: its damage, except for a plan solved with --robust, whose
    damage adds each cell's spread: there the KL sum --select-measured recorded for the chosen candidate."""
    got = recorded_kl_sum(plan) if plan.solver.robust else None
    return plan.predicted.damage if got is None else got


def recorded_kl_sum(plan) -> float | None:
    """The KL sum --select-measured recorded for the candidate it chose; None where it recorded none."""
    select = plan.solver.select
    for c in (select or {}).get("candidates", ()):
        if c.get("name") == select.get("chosen") and c.get("predicted_kl") is not None:
            return float(c["predicted_kl"])
    return None
