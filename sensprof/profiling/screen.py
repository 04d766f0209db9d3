"""Screened profiling (opt-in, --screen): end-to-end passes only for cells a plan can choose.

Within one (layer, tensor) the end-to-end KL of a scheme follows its local attention-output error closely (on
the default model the log-log correlation is 0.98-1.00 per layer). So every cell first gets its local metrics
(the quantized layer alone, cheap); three anchors spread over the local error are measured end to end; a
log-log line through the measured cells predicts the rest. A planner that minimises summed damage under a
summed memory budget picks, in every layer but at most a few, points on that layer's lower convex hull of
(bits, damage); so each cell on the hull of (bits, measured-or-predicted KL) is measured, the line refitted
and the hull recomputed, until every hull cell is measured. Cells off the hull keep their predicted KL and are
marked `measured = False` in the table. Imports no torch.
"""

from __future__ import annotations

import math

ANCHORS = 3
MIN_LOCAL = 1e-12  # a lossless cell (local error 0) is predicted at the line's floor


def anchors(local: dict[str, float], n: int = ANCHORS) -> list[str]:
    """The schemes measured first: the smallest, the largest and evenly spread local errors."""
    order = sorted(local, key=lambda s: (local[s], s))
    if len(order) <= n:
        return order
    picks = sorted({round(i * (len(order) - 1) / (n - 1)) for i in range(n)})
    return [order[i] for i in picks]


def fit_line(local: dict[str, float], kl: dict[str, float]) -> tuple[float, float]:
    """log KL = a + b log local, least squares over the measured cells (slope 2 with fewer than two points:
    KL is quadratic in a small perturbation)."""
    pts = [(math.log(max(local[s], MIN_LOCAL)), math.log(kl[s])) for s in kl if kl[s] > 0]
    if not pts:
        return -math.inf, 2.0
    xs, ys = zip(*pts)
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx if len(pts) >= 2 and sxx > 1e-12 else 2.0
    b = min(max(b, 0.5), 4.0)  # a line fitted through near-equal errors can come out flat or steep
    return my - b * mx, b


def predict(local: dict[str, float], kl: dict[str, float]) -> dict[str, float]:
    """Measured KL where there is one, the fitted line's elsewhere."""
    a, b = fit_line(local, kl)
    return {s: kl[s] if s in kl else (math.exp(a + b * math.log(max(local[s], MIN_LOCAL))) if a > -math.inf
                                      else 0.0) for s in local}


def pareto_front(names, cost: dict[str, float], damage: dict[str, float]) -> list[str]:
    """The schemes no cheaper-or-equal one beats on damage, cheapest first (ties kept in `names`' order)."""
    front, best = [], math.inf
    for s in sorted(names, key=lambda s: (cost[s], damage[s])):
        if damage[s] < best:
            front.append(s)
            best = damage[s]
    return front


def lower_hull(bits: dict[str, float], damage: dict[str, float]) -> list[str]:
    """The schemes on the lower convex hull of (bits, damage), cheapest first: the only ones a Lagrangian
    trade of memory for damage ever picks."""
    hull: list[str] = []
    for s in pareto_front(sorted(bits), bits, damage):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (damage[b] - damage[a]) * (bits[s] - bits[a]) >= (damage[s] - damage[a]) * (bits[b] - bits[a]):
                hull.pop()
            else:
                break
        hull.append(s)
    return hull


def to_measure(bits: dict[str, float], local: dict[str, float], kl: dict[str, float]) -> list[str]:
    """The next cells to measure end to end ([] when every hull cell is measured)."""
    if not kl:
        return anchors(local)
    hull = lower_hull(bits, predict(local, kl))
    return [s for s in hull if s not in kl]


def fill_rows(rows: list[dict]) -> None:
    """Give the unmeasured rows of one (layer, tensor) their predicted KL; kl_std and dnll scale with it by the
    measured cells' median ratio to their KL."""
    local = {r["scheme"]: r["out_rel_l2"] for r in rows}
    kl = {r["scheme"]: r["kl"] for r in rows if r["measured"]}
    pred = predict(local, kl)

    def median_ratio(col):
        ratios = sorted(r[col] / r["kl"] for r in rows if r["measured"] and r["kl"] > 0)
        return ratios[len(ratios) // 2] if ratios else 0.0

    std_ratio, dnll_ratio = median_ratio("kl_std"), median_ratio("dnll")
    for r in rows:
        if not r["measured"]:
            r["kl"] = pred[r["scheme"]]
            r["kl_std"] = r["kl"] * std_ratio
            r["dnll"] = r["kl"] * dnll_ratio
