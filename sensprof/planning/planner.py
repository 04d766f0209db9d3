"""Choose each layer's K and V scheme: an integer program (PuLP + bundled CBC). Imports no torch.

Minimises the summed measured damage of the chosen (layer, tensor, scheme) cells under a memory
budget, within what the target engine can express (see targets.py).
"""

from __future__ import annotations

import itertools
import math
import time
import warnings
from dataclasses import dataclass, field

from ..artifacts import EngineSettings, engine_settings
from .budget import VLLM_CPU_ITEMSIZES, Budget, vllm_cpu_pool, vllm_layer_bytes, vllm_storage
from ..profiling.table import OBJECTIVES
from ..errors import SensprofError
from ..schemes import get_scheme
from ..targets import EngineDtype, Target, is_pair

NONE = "none"


@dataclass
class Problem:
    """Per-layer facts and the measured damage of each profiled cell."""

    layers: list[dict]
    damage: dict[tuple[int, str, str], float]  # (layer, "K"|"V", scheme) -> damage; "none" costs 0
    options: dict[str, list[str]] = field(default_factory=dict)  # tensor -> schemes profiled on every layer

    def cell(self, layer: int, tensor: str, scheme: str) -> float:
        return 0.0 if scheme == NONE else self.damage[(layer, tensor, scheme)]


def problem_from_table(table, layers: list[dict], objective: str = "kl", robust: float = 0.0) -> Problem:
    """Build the problem from a profile table (pandas DataFrame with layer, tensor, scheme and metrics).

    `robust` > 0 (objective kl): each cell costs its mean KL plus `robust` times its spread across windows, so a
    scheme that is cheap on average but bad on some text loses to a steadier one."""
    if objective not in OBJECTIVES:
        raise SensprofError(f"unknown --objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if robust < 0:
        raise SensprofError(f"--robust {robust:g} is negative; pass a multiple of the spread >= 0, e.g. 1")
    if not robust < float("inf"):  # NaN or infinite: blame the argument, not the profile's costs it would make NaN
        raise SensprofError(f"--robust {robust:g} is not a finite number; pass a multiple of the spread >= 0, e.g. 1")
    if robust and objective != "kl":
        raise SensprofError("--robust weighs the KL's spread across windows; use it with --objective kl")
    col = OBJECTIVES[objective]
    damage = {(int(r.layer), str(r.tensor), str(r.scheme)):
              float(getattr(r, col)) + (robust * float(r.kl_std) if robust else 0.0) for r in table.itertuples()}
    for (layer, tensor, scheme), value in damage.items():
        if not math.isfinite(value):  # the solver cannot weigh it; load_profile refuses such tables already
            raise SensprofError(f"the {col} of layer {layer} {tensor} {scheme} is {value}, not a finite number; "
                                "re-run `sensprof profile` for a sound table")
    n = len(layers)
    options = {}
    for tensor in ("K", "V"):
        names = [s for s in dict.fromkeys(table[table.tensor == tensor].scheme)
                 if all((i, tensor, s) in damage for i in range(n))]
        options[tensor] = names
    return Problem(layers, damage, options)


@dataclass
class Solution:
    choices: list[tuple[str, str]]  # per layer (K scheme, V scheme)
    engine: EngineSettings | dict  # the solver's dict, made the target's EngineSettings by plan()
    status: str
    solve_time_s: float
    damage: float
    cost: float
    limit: float


def _cost(budget: Budget, layer: dict, scheme: str) -> float:
    return budget.cost(get_scheme(scheme), layer)


def _solve(prob, variables_time_start):
    """CBC's problem and solution files go in a folder of their own, removed however the solve ends (Ctrl-C of a
    sweep left PuLP's .mps and .sol files in the temporary folder)."""
    import shutil
    import tempfile

    import pulp

    solver = pulp.PULP_CBC_CMD(msg=False)
    solver.tmpDir = tempfile.mkdtemp(prefix="sensprof-cbc-")
    try:
        status = prob.solve(solver)
    finally:
        shutil.rmtree(solver.tmpDir, ignore_errors=True)
    return pulp.LpStatus[status], time.perf_counter() - variables_time_start


def _finish(problem, budget, choices, engine, status, elapsed) -> Solution:
    damage = sum(problem.cell(i, "K", k) + problem.cell(i, "V", v) for i, (k, v) in enumerate(choices))
    cost = sum(_cost(budget, problem.layers[i], k) + _cost(budget, problem.layers[i], v)
               for i, (k, v) in enumerate(choices))
    return Solution(choices, engine, status, elapsed, damage, cost, budget.limit(problem.layers))


def _require_feasible(min_cost: float, budget: Budget, layers, target: Target):
    limit = budget.limit(layers)
    if min_cost > limit * (1 + 1e-12):
        raise SensprofError(
            f"the budget {budget.describe(limit, layers)} is infeasible for target {target.name}: the smallest "
            f"feasible budget with the profiled schemes is {budget.describe(min_cost, layers)}")


def plan(problem: Problem, target: Target, budget: Budget, num_skip: int | None = None,
         near: tuple[list[tuple[str, str]], int] | None = None) -> Solution:
    """Solve the integer program for `target` under `budget`; refuse infeasible budgets with the minimum.

    `near` = (choices, M): the free target only, change at most M of these per-layer (K, V) choices (a trust region
    for `plan --refine`, whose in-context costs hold only near the plan they were measured around)."""
    solvers = {"free": _plan_free, "global_skip": _plan_global_skip, "global": _plan_global,
               "global_kv": _plan_global_kv, "per_layer": _plan_per_layer}
    if num_skip is not None and target.structure != "global_skip":
        raise SensprofError(f"--num-skip only applies to target vllm, not {target.name}")
    if num_skip is not None and not 0 <= num_skip <= len(problem.layers):
        raise SensprofError(f"--num-skip {num_skip} is out of range: the model has {len(problem.layers)} layers")
    with warnings.catch_warnings():  # PuLP 3.x announces its 4.0 API; pulp < 4 is pinned
        warnings.filterwarnings("ignore", message=r".*PuLP 4\.0", category=DeprecationWarning)
        if target.structure == "global_skip":
            solution = solvers[target.structure](problem, target, budget, num_skip)
        elif near is not None:
            if target.structure != "free":
                raise SensprofError(f"a bound on changed choices needs per-layer choices; target {target.name} has none")
            solution = _plan_free(problem, target, budget, near)
        else:
            solution = solvers[target.structure](problem, target, budget)
    solution.engine = engine_settings(target.name, solution.engine)  # the typed record the plan keeps
    return solution


def _scale(problem: Problem) -> float:
    """CBC works to absolute tolerances; bring the damages to order one."""
    m = max((abs(v) for v in problem.damage.values()), default=1.0)
    return 1.0 / m if m > 0 else 1.0


def _plan_free(problem: Problem, target: Target, budget: Budget, near=None) -> Solution:
    import pulp

    t0 = time.perf_counter()
    layers, limit, sc = problem.layers, budget.limit(problem.layers), _scale(problem)
    opts = {t: [s for s in problem.options[t] if runtime_format(s)] + [NONE] for t in ("K", "V")}
    min_cost = sum(min(_cost(budget, layer, s) for s in opts[t]) for layer in layers for t in ("K", "V"))
    _require_feasible(min_cost, budget, layers, target)
    prob = pulp.LpProblem("sensprof_free", pulp.LpMinimize)
    x = {(i, t, j): pulp.LpVariable(f"x_{i}_{t}_{j}", cat="Binary")
         for i in range(len(layers)) for t in ("K", "V") for j in range(len(opts[t]))}
    prob += pulp.lpSum(sc * problem.cell(i, t, opts[t][j]) * v for (i, t, j), v in x.items())
    for i in range(len(layers)):
        for t in ("K", "V"):
            prob += pulp.lpSum(x[(i, t, j)] for j in range(len(opts[t]))) == 1
    prob += pulp.lpSum(_cost(budget, layers[i], opts[t][j]) / limit * v for (i, t, j), v in x.items()) <= 1 + 1e-9
    anchor = None
    if near is not None:
        anchor = {(i, t): near[0][i][0 if t == "K" else 1] for i in range(len(layers)) for t in ("K", "V")}
        kept = [x[(i, t, opts[t].index(s))] for (i, t), s in anchor.items() if s in opts[t]]
        prob += pulp.lpSum(kept) >= len(anchor) - near[1]
    status, elapsed = _solve(prob, t0)
    if status != "Optimal":
        raise SensprofError(f"the solver ended with status {status}; try a larger budget")
    pick = {(i, t): next(opts[t][j] for j in range(len(opts[t])) if x[(i, t, j)].value() > 0.5)
            for i in range(len(layers)) for t in ("K", "V")}
    _polish(problem, budget, opts, pick, limit, anchor, near[1] if near else None)
    choices = [(pick[(i, "K")], pick[(i, "V")]) for i in range(len(layers))]
    return _finish(problem, budget, choices, {}, status, time.perf_counter() - t0)


def runtime_format(name: str) -> bool:
    """The free target is run by sensprof's runtime, which stores sensprof's formats, not an engine's."""
    s = get_scheme(name)
    return not (s.is_engine or s.query or s.rotation)


def _polish(problem: Problem, budget: Budget, opts, pick: dict, limit: float, anchor=None, max_changes=None) -> None:
    """Single-cell improvements the solver's tolerances hid: damages span many decades (1e-11..1e-1),
    and CBC treats a cell 1e-7 below the largest as free. Each move lowers damage and keeps the budget (and, with
    an anchor, leaves at most `max_changes` cells changed from it)."""
    cost = {k: _cost(budget, problem.layers[k[0]], s) for k, s in pick.items()}
    slack = limit - sum(cost.values())
    while True:
        best = None
        changed = 0 if anchor is None else sum(pick[k] != anchor[k] for k in pick)
        for (i, t), s in pick.items():
            here = problem.cell(i, t, s)
            for alt in opts[t]:
                gain = here - problem.cell(i, t, alt)
                extra = _cost(budget, problem.layers[i], alt) - cost[(i, t)]
                if anchor is not None and changed - (s != anchor[(i, t)]) + (alt != anchor[(i, t)]) > max_changes:
                    continue
                if gain > 0 and extra <= slack + 1e-9 * limit and (best is None or gain > best[0]):
                    best = (gain, (i, t), alt, extra)
        if best is None:
            return
        _, key, alt, extra = best
        pick[key], cost[key], slack = alt, cost[key] + extra, slack - extra


def _dtypes_both(problem: Problem, target: Target, include_none: bool) -> list[EngineDtype]:
    """The target's dtypes whose K and V schemes were both profiled on every layer (a tensor a dtype keeps at the
    model dtype needs no profile), those that keep both (auto) first where `include_none`."""
    def profiled(d: EngineDtype) -> bool:
        return all(s == NONE or s in problem.options[t] for t, s in (("K", d.k_scheme), ("V", d.v_scheme)))

    out = [d for d in target.dtypes if d.schemes != (NONE, NONE) and profiled(d)]
    if include_none:
        out = [d for d in target.dtypes if d.schemes == (NONE, NONE)] + out
    if not out:
        have = sorted(set(problem.options["K"]) | set(problem.options["V"]))
        need = target.schemes_needed()
        raise SensprofError(
            f"the profile has none of the schemes target {target.name} needs ({', '.join(need)}); it has "
            f"{', '.join(have) or 'none'}: re-run `sensprof profile --target {target.name}` to profile them")
    return out


def _plan_global_skip(problem: Problem, target: Target, budget: Budget, num_skip: int | None) -> Solution:
    """One dtype for every layer but a set kept at the model dtype. A dtype with boundary layers (vLLM's
    TurboQuant) forces those into the set, priced at the model dtype; --num-skip counts the planner's own."""
    import pulp

    t0 = time.perf_counter()
    layers, limit, sc = problem.layers, budget.limit(problem.layers), _scale(problem)
    n = len(layers)
    dts = _dtypes_both(problem, target, include_none=False)
    forced = [set(d.forced_skips(n)) for d in dts]
    full = [_cost(budget, layer, NONE) * 2 for layer in layers]
    cost = {(i, d): _cost(budget, layers[i], dts[d].k_scheme) + _cost(budget, layers[i], dts[d].v_scheme)
            for i in range(n) for d in range(len(dts))}

    def cheapest(d):
        free = [i for i in range(n) if i not in forced[d]]
        extra = sorted(cost[(i, d)] - full[i] for i in free)
        if num_skip is None:
            return sum(full) + sum(min(e, 0.0) for e in extra)
        if num_skip > len(free):
            return float("inf")
        return sum(full) + sum(extra[:len(free) - num_skip])

    min_cost = min(cheapest(d) for d in range(len(dts)))
    if min_cost == float("inf"):
        raise SensprofError(f"--num-skip {num_skip} leaves no layer to quantize once vLLM's own boundary layers "
                            "are kept; pass a smaller --num-skip")
    _require_feasible(min_cost, budget, layers, target)
    prob = pulp.LpProblem("sensprof_vllm", pulp.LpMinimize)
    y = [pulp.LpVariable(f"y_{d}", cat="Binary") for d in range(len(dts))]
    u = [pulp.LpVariable(f"skip_{i}", cat="Binary") for i in range(n)]
    z = {(i, d): pulp.LpVariable(f"z_{i}_{d}", lowBound=0, upBound=1) for i in range(n) for d in range(len(dts))}
    dmg = {(i, d): problem.cell(i, "K", dts[d].k_scheme) + problem.cell(i, "V", dts[d].v_scheme)
           for i in range(n) for d in range(len(dts))}
    prob += pulp.lpSum(sc * dmg[k] * v for k, v in z.items())
    prob += pulp.lpSum(y) == 1
    for (i, d), v in z.items():  # z = y[d] and not skipped
        prob += v <= y[d]
        prob += v <= 1 - u[i]
        prob += v >= y[d] - u[i]
    for d in range(len(dts)):
        for i in forced[d]:
            prob += u[i] >= y[d]
    prob += (pulp.lpSum(full[i] / limit * u[i] for i in range(n))
             + pulp.lpSum(cost[k] / limit * v for k, v in z.items())) <= 1 + 1e-9
    if num_skip is not None:
        prob += pulp.lpSum(u) - pulp.lpSum(len(forced[d]) * y[d] for d in range(len(dts))) == num_skip
    status, elapsed = _solve(prob, t0)
    if status != "Optimal":
        raise SensprofError(f"the solver ended with status {status}; try a larger budget")
    d = next(j for j in range(len(dts)) if y[j].value() > 0.5)
    skipped = [i for i in range(n) if u[i].value() > 0.5]
    dt = dts[d]
    choices = [(NONE, NONE) if i in skipped else dt.schemes for i in range(n)]
    engine = {"kv_cache_dtype": dt.flag_value if len(skipped) < n else "auto", "k_scheme": dt.k_scheme,
              "v_scheme": dt.v_scheme, "skip_layers": skipped, "forced_skip_layers": sorted(forced[d]),
              "needs_scales": dt.needs_scales, "vllm_gpu": target.gpu}
    return _finish(problem, budget, choices, engine, status, elapsed)


def _plan_per_layer(problem: Problem, target: Target, budget: Budget) -> Solution:
    """Each layer its own dtype, its K and V as that dtype stores them (vLLM through sensprof's plugin)."""
    import pulp

    t0 = time.perf_counter()
    layers, limit, sc = problem.layers, budget.limit(problem.layers), _scale(problem)
    n = len(layers)
    _dtypes_both(problem, target, include_none=False)  # refuses a profile with none of the target's schemes
    dts = _dtypes_both(problem, target, include_none=True)
    cost = {(i, d): _cost(budget, layers[i], dts[d].k_scheme) + _cost(budget, layers[i], dts[d].v_scheme)
            for i in range(n) for d in range(len(dts))}
    _require_feasible(sum(min(cost[(i, d)] for d in range(len(dts))) for i in range(n)), budget, layers, target)
    windows = [layer.get("window") if layer.get("kind") == "sliding" else None for layer in layers]
    hybrid = len(set(windows)) > 1
    if hybrid and target.gpu != "cpu":  # vLLM 0.33 unifies such pages on CUDA by its own rules (facts.plan_pool)
        raise SensprofError(f"per-layer plans of sliding-window models are served on vLLM's CPU backend only so far, "
                            f"not on {target.gpu}: plan this model with --vllm-gpu cpu --per-layer, or drop "
                            "--per-layer for one dtype plus skipped layers")
    best = None
    # a hybrid model (sliding-window and full layers): vLLM pads pages and groups (budget.vllm_cpu_pool); the plan
    # takes only assignments it pads nothing in, at every model dtype it is served at, so the price is the allocation
    def pads(pick) -> bool:
        return any(vllm_cpu_pool([(d.flag_value, layer["kv_heads"], layer["head_dim"], w)
                                  for d, layer, w in zip(pick, layers, windows)], itemsize).padded
                   for itemsize in VLLM_CPU_ITEMSIZES)

    # first without the no-padding constraints: where that optimum pads nothing it is the optimum with them
    for sizes in [None] + (_group_size_choices(layers, windows, [d.flag_value for d in dts]) if hybrid else []):
        prob = pulp.LpProblem("sensprof_vllm_per_layer", pulp.LpMinimize)
        x = {k: pulp.LpVariable(f"x_{k[0]}_{k[1]}", cat="Binary") for k in cost}
        prob += pulp.lpSum(sc * (problem.cell(i, "K", dts[d].k_scheme) + problem.cell(i, "V", dts[d].v_scheme)) * v
                           for (i, d), v in x.items())
        for i in range(n):
            prob += pulp.lpSum(x[(i, d)] for d in range(len(dts))) == 1
        prob += pulp.lpSum(cost[k] / limit * v for k, v in x.items()) <= 1 + 1e-9
        if sizes is not None:
            _no_padding(prob, x, layers, windows, [d.flag_value for d in dts], sizes)
        status, elapsed = _solve(prob, t0)
        if status == "Optimal":
            pick = [dts[next(d for d in range(len(dts)) if x[(i, d)].value() > 0.5)] for i in range(n)]
            if sizes is None and hybrid and pads(pick):
                continue
            if best is None or pulp.value(prob.objective) < best[0]:
                best = (pulp.value(prob.objective), status, pick)
            if sizes is None:
                break
        elif sizes is None:
            raise SensprofError(f"the solver ended with status {status}; try a larger budget")
    if best is None:  # hybrid, and no group size admits a padding-free plan within the budget
        raise SensprofError(f"the budget {budget.describe(limit, layers)} is infeasible for target {target.name} on "
                            "this sliding-window model once vLLM's page padding is avoided (every layer's bytes per "
                            "token must divide the largest layer's: docs/vllm-plugin.md); give a larger budget")
    _, status, pick = best
    assert not (hybrid and pads(pick)), [d.flag_value for d in pick]  # the constraints are vLLM's arithmetic
    return _finish(problem, budget, [d.schemes for d in pick], per_layer_engine(pick, target.gpu), status,
                   time.perf_counter() - t0)


def _buckets(layers, windows, flags, itemsize) -> dict[tuple, list[tuple[int, int]]]:
    """(layer, dtype index) choices by the vLLM spec they give the layer at `itemsize` (window, shape, storage)."""
    out: dict[tuple, list[tuple[int, int]]] = {}
    for i, layer in enumerate(layers):
        for d, f in enumerate(flags):
            key = (windows[i], layer["kv_heads"], layer["head_dim"], vllm_storage(f, layer["head_dim"], itemsize))
            out.setdefault(key, []).append((i, d))
    return out


def _group_size_choices(layers, windows, flags) -> list[tuple[int, ...]]:
    """The smallest bucket's size vLLM groups by, per served model dtype: every bucket of a padding-free plan is a
    multiple of it, so it divides each attention type's layer count. Where the dtypes make the same buckets at every
    model dtype (the usual case), the sizes are one and the same."""
    counts = [windows.count(w) for w in dict.fromkeys(windows)]
    g = math.gcd(*counts)
    divisors = [m for m in range(1, g + 1) if g % m == 0]
    parts = {frozenset(frozenset(v) for v in _buckets(layers, windows, flags, i).values()) for i in VLLM_CPU_ITEMSIZES}
    if len(parts) == 1:
        return [(m,) * len(VLLM_CPU_ITEMSIZES) for m in divisors]
    return list(itertools.product(divisors, repeat=len(VLLM_CPU_ITEMSIZES)))


def _no_padding(prob, x, layers, windows, flags, sizes) -> None:
    """Linear constraints under which vLLM's CPU pool pads nothing (budget.vllm_cpu_pool), at each served itemsize:
    (1) every layer's bytes per token divide the largest layer's (u_M picks the largest, M, which some layer takes);
    (2) every bucket of equal specs (window, shape, storage) holds a multiple of `m` layers, and one holds exactly m,
    so vLLM's groups are all m layers wide."""
    import pulp

    n = len(layers)
    for t, (itemsize, m) in enumerate(zip(VLLM_CPU_ITEMSIZES, sizes)):
        c = {(i, d): vllm_layer_bytes(f, layers[i]["kv_heads"], layers[i]["head_dim"], itemsize)
             for (i, d) in x for f in (flags[d],)}
        tops = sorted(set(c.values()))
        u = {top: pulp.LpVariable(f"max_{t}_{top}", cat="Binary") for top in tops}
        prob += pulp.lpSum(u.values()) == 1
        for k, v in x.items():
            prob += v <= pulp.lpSum(u[top] for top in tops if top % c[k] == 0)
        for top in tops:
            prob += pulp.lpSum(v for k, v in x.items() if c[k] == top) >= u[top]
        exact = []
        for j, members in enumerate(_buckets(layers, windows, flags, itemsize).values()):
            k = pulp.LpVariable(f"k_{t}_{j}", lowBound=0, upBound=n // m, cat="Integer")
            w = pulp.LpVariable(f"w_{t}_{j}", cat="Binary")
            prob += pulp.lpSum(x[c] for c in members) == m * k
            prob += w <= k
            prob += k - 1 <= (n // m) * (1 - w)
            exact.append(w)
        prob += pulp.lpSum(exact) >= 1


def per_layer_engine(pick: list[EngineDtype], gpu: str | None) -> dict:
    """A per-layer plan's settings: each layer's dtype, and as vLLM's one --kv-cache-dtype the one the plugin sets
    globally (the fp8 variant most layers take: vLLM's CPU metadata builder reads the global dtype); where the
    quantized layers share one of vLLM's dtypes, the rest are its skipped layers, so the plan also runs without the
    plugin. A layer with K and V in their own formats has the plugin's backend and counts for neither."""
    quantized = [d for d in pick if d.schemes != (NONE, NONE)]
    own = [d for d in quantized if not is_pair(d.flag_value)]
    counts = {f: sum(d.flag_value == f for d in own) for f in dict.fromkeys(d.flag_value for d in own)}
    main = max(counts, key=lambda f: (counts[f], f == "fp8_e4m3")) if counts else "auto"
    one = next((d for d in own if d.flag_value == main), None)
    expressible = len(counts) <= 1 and len(own) == len(quantized)
    return {"kv_cache_dtype": main, "k_scheme": one.k_scheme if one else NONE, "v_scheme": one.v_scheme if one else NONE,
            "skip_layers": [i for i, d in enumerate(pick) if d.schemes == (NONE, NONE)] if expressible and one else [],
            "vllm_gpu": gpu, "layer_dtypes": [d.flag_value for d in pick]}


def _plan_global(problem: Problem, target: Target, budget: Budget) -> Solution:
    return _plan_pairs(problem, target, budget, tied=True)


def _plan_global_kv(problem: Problem, target: Target, budget: Budget) -> Solution:
    return _plan_pairs(problem, target, budget, tied=False)


def _plan_pairs(problem: Problem, target: Target, budget: Budget, tied: bool) -> Solution:
    """One dtype for every layer: tied (K and V alike) or one for K and one for V."""
    import pulp

    t0 = time.perf_counter()
    layers, limit, sc = problem.layers, budget.limit(problem.layers), _scale(problem)
    n = len(layers)
    if tied:
        _dtypes_both(problem, target, include_none=False)  # refuses a profile with none of the target's schemes
        dts = _dtypes_both(problem, target, include_none=True)
        k_opts = v_opts = dts
    else:
        k_opts = [d for d in target.dtypes if d.k_scheme == NONE or d.k_scheme in problem.options["K"]]
        v_opts = [d for d in target.dtypes if d.v_scheme == NONE or d.v_scheme in problem.options["V"]]
        if len(k_opts) <= 1 and len(v_opts) <= 1:
            _dtypes_both(problem, target, include_none=False)  # raises the "profile lacks schemes" error

    def total(tensor, d):
        scheme = d.k_scheme if tensor == "K" else d.v_scheme
        return (sum(problem.cell(i, tensor, scheme) for i in range(n)),
                sum(_cost(budget, layers[i], scheme) for i in range(n)))

    kt = [total("K", d) for d in k_opts]
    vt = [total("V", d) for d in v_opts]
    allowed = [(j, m) for j in range(len(k_opts)) for m in range(len(v_opts)) if target.allows(k_opts[j], v_opts[m])]
    if tied:
        min_cost = min(kt[j][1] + vt[j][1] for j in range(len(k_opts)))
    else:
        min_cost = min(kt[j][1] + vt[m][1] for j, m in allowed)
    _require_feasible(min_cost, budget, layers, target)
    prob = pulp.LpProblem("sensprof_global", pulp.LpMinimize)
    yk = [pulp.LpVariable(f"k_{j}", cat="Binary") for j in range(len(k_opts))]
    yv = yk if tied else [pulp.LpVariable(f"v_{j}", cat="Binary") for j in range(len(v_opts))]
    prob += pulp.lpSum(sc * kt[j][0] * yk[j] for j in range(len(k_opts))) + \
        pulp.lpSum(sc * vt[j][0] * yv[j] for j in range(len(v_opts)))
    prob += pulp.lpSum(yk) == 1
    if not tied:
        prob += pulp.lpSum(yv) == 1
        for j in range(len(k_opts)):
            for m in range(len(v_opts)):
                if (j, m) not in allowed:
                    prob += yk[j] + yv[m] <= 1
    prob += (pulp.lpSum(kt[j][1] / limit * yk[j] for j in range(len(k_opts)))
             + pulp.lpSum(vt[j][1] / limit * yv[j] for j in range(len(v_opts)))) <= 1 + 1e-9
    status, elapsed = _solve(prob, t0)
    if status != "Optimal":
        raise SensprofError(f"the solver ended with status {status}; try a larger budget")
    dk = k_opts[next(j for j in range(len(k_opts)) if yk[j].value() > 0.5)]
    dv = v_opts[next(j for j in range(len(v_opts)) if yv[j].value() > 0.5)]
    choices = [(dk.k_scheme, dv.v_scheme)] * n
    if tied:
        engine = {"kv_cache_dtype": dk.flag_value, "k_scheme": dk.k_scheme, "v_scheme": dk.v_scheme,
                  "needs_scales": dk.needs_scales}
    else:
        engine = {"cache_type_k": dk.flag_value, "cache_type_v": dv.flag_value, "channel_order": target.channel_order}
    return _finish(problem, budget, choices, engine, status, elapsed)
