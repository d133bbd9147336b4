"""A pipeline bound that counts every GPU type's powered groups (issue 12 item 4).

When the fastest GPUs cannot hold all pp x dp replica stages, the plain pipeline bound
(every stage on its fastest GPU) is far below what any plan reaches: on
tests/instances/power-bound-8-sites.yaml, tp8-pp20-dp1024 has a plain bound of 11.7 s
while half of its 20,480 stages must run on H100/H200 groups, 2.3x slower. slow_slot_bound
(driver) charges one slow stage; this bound charges as many as the capacities force.

Each replica's chain takes at least (any schedule that respects the micro-batches'
dependencies and runs one operation at a time per device; the 1F1B closed form is one
such schedule), with f_s, b_s the forward and backward of model stage (chunk) s on its
host, m micro-batches, S = v pp model stages and d the least delay of one pipeline
message between consecutive model stages (PerfModel.message_floor: its latency plus its
transmit; every delivery on a dependency path pays both, placer.perf.critical_path):

* sum_s (f_s + b_s) + 2 (S - 1) d: one micro-batch passes every chunk forward and back,
  crossing S - 1 boundaries each way;
* the same + (m - 1) f_s0 for each chunk s0: its m forwards run one after the other; the
  first cannot start before the chunks ahead of it (and s0 boundaries), and after the
  last one that micro-batch still runs every later chunk forward and back and every
  chunk up to s0 back (the other 2 (S - 1) - s0 crossings); likewise with (m - 1) b_s0;
* m (work of device k) + sum_{s < k} (f_s + b_s) + 2 k d for each pipeline rank k: the
  device runs all its m micro-batches of its chunks, cannot start before the first
  micro-batch has passed the chunks ahead of its first one (k boundaries), and after its
  last operation (a backward of a chunk >= k) the gradient still runs back through
  chunks 0..k-1 (at least k boundaries).

Every one is linear in per-slot terms, so each holds for the average over the dp
replicas, and T_pipe (the slowest chain) is at least that average. The average
assignment is a fractional assignment x[k, kind] (the share of replicas whose stage k
runs on a GPU kind) with sum over kinds 1 and, per kind, sum over k of x at most the
kind's powered groups / dp (one TP group hosts one stage of one replica). The bound is
min over such x of the largest of the inequalities (an LP); the optimizer step is added
as in PerfModel.pipeline_lower_bound. Checked against brute force in
tests/test_scale_bounds.py.
"""

from __future__ import annotations

import math

import numpy as np

from placer.io import Problem
from placer.optimize.presolve import SiteCap
from placer.perf.step import Config, PerfModel

Kind = tuple[str, int]  # (GPU type, GPUs per node): what the stage times and groups read


def capacity_bound(
    problem: Problem,
    perf: PerfModel,
    cfg: Config,
    hosts: list[set[str]],
    caps: dict[str, SiteCap],
    kinds: dict[str, Kind],
) -> float:
    """The bound above (0 when it cannot be formed; inf when the kinds that may host the
    stages have too few groups for pp x dp). `hosts` may hold one site per kind (the
    driver's reduced host sets): a kind hosts stage k when any of its sites in hosts[k]
    does, and its capacity is every site of that kind (a relaxation, so the bound holds)."""
    import highspy

    if cfg.dualpipev:
        return 0.0  # not formed for the V layout (a weaker bound: pipeline_lower_bound)
    v, pp, m, dp = cfg.virtual_stages, cfg.pp, cfg.num_micro_batches, cfg.dp
    S = v * pp
    groups: dict[Kind, float] = {}
    for x, c in caps.items():
        if x in kinds:
            groups[kinds[x]] = groups.get(kinds[x], 0.0) + c.groups(cfg.tp, width=cfg.width)
    gpu_of = {kinds[x]: x for x in sorted(set().union(*hosts))}  # a site per kind present
    host_kinds = [sorted({kinds[x] for x in h}) for h in hosts]
    cols = [(k, q) for k in range(pp) for q in host_kinds[k] if groups.get(q, 0) > 0]
    if not cols:
        return math.inf
    times = {
        q: perf.chunk_times(cfg, problem.instance.site(x).gpu) for q, x in sorted(gpu_of.items())
    }
    n = len(cols)
    rank_cols: list[list[int]] = [[] for _ in range(pp)]
    for j, (k, _q) in enumerate(cols):
        rank_cols[k].append(j)
    if any(not c for c in rank_cols):
        return math.inf  # some stage has no kind with groups: no plan
    fb = {
        (j, s): (times[q][s].fwd, times[q][s].bwd)
        for j, (k, q) in enumerate(cols)
        for s in range(k, S, pp)
    }
    work = [0.0] * n  # a slot's chunks, forward and backward
    for (j, _s), (f, b) in fb.items():
        work[j] += f + b
    # columns: x (n), z, W = sum_s (f_s + b_s), P_k = sum_{s < k} (f_s + b_s) (k < pp),
    # all in the average replica; sparse rows, so that pp 160 stays small
    iz, iw = n, n + 1
    ip = n + 2
    ncol = ip + pp
    inf = highspy.kHighsInf
    lat_f, tx_f = perf.message_floor(cfg, set().union(*hosts))
    through = 2 * (S - 1) * (lat_f + tx_f)  # one micro-batch's crossings, there and back
    rows: list[tuple[list[int], list[float], float, float]] = []
    rows.append(([*range(n), iw], [*work, -1.0], 0.0, 0.0))  # W = ...
    rows.append(([iz, iw], [1.0, -1.0], through, inf))  # one micro-batch through
    for s in range(S):
        js = rank_cols[s % pp]
        for d in (0, 1):  # m forwards (backwards) of chunk s one after the other
            vals = [-(m - 1) * fb[(j, s)][d] for j in js]
            rows.append(([iz, iw, *js], [1.0, -1.0, *vals], through, inf))
    rows.append(([ip], [1.0], 0.0, 0.0))  # P_0 = 0
    for k in range(pp - 1):  # P_{k+1} = P_k + chunk k (rank k's first chunk)
        js = rank_cols[k]
        vals = [-(fb[(j, k)][0] + fb[(j, k)][1]) for j in js]
        rows.append(([ip + k + 1, ip + k, *js], [1.0, -1.0, *vals], 0.0, 0.0))
    for k in range(pp):  # device k: m x its work, after the chunks ahead of it
        js = rank_cols[k]
        ahead = 2 * k * (lat_f + tx_f)  # micro-batch 0 there, the last gradient back
        rows.append(([iz, ip + k, *js], [1.0, -1.0, *(-m * work[j] for j in js)], ahead, inf))
    for k in range(pp):
        rows.append((rank_cols[k], [1.0] * len(rank_cols[k]), 1.0, 1.0))
    for q in sorted({q for _, q in cols}):
        js = [j for j, (_k, qq) in enumerate(cols) if qq == q]
        rows.append((js, [1.0] * len(js), 0.0, groups[q] / dp))
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = ncol, len(rows)
    cost = np.zeros(ncol)
    cost[iz] = 1.0
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(ncol)
    lp.col_upper_ = np.full(ncol, inf)
    lp.row_lower_ = np.array([r[2] for r in rows])
    lp.row_upper_ = np.array([r[3] for r in rows])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.cumsum([0] + [len(r[0]) for r in rows]).astype(np.int32)
    lp.a_matrix_.index_ = np.array([i for r in rows for i in r[0]], dtype=np.int32)
    lp.a_matrix_.value_ = np.array([v for r in rows for v in r[1]], dtype=np.float64)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("presolve", "off")  # tiny LPs: presolve costs more than it saves
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    if status == highspy.HighsModelStatus.kInfeasible:
        return math.inf
    if status != highspy.HighsModelStatus.kOptimal:
        return 0.0
    # the LP's optimum less HiGHS' tolerances (1e-7 relative on these O(1) second values):
    # a bound must not exceed what a plan reaches
    z = h.getInfo().objective_function_value * (1 - 1e-6)
    site = problem.instance.site
    opt = max(
        min(perf.stage_times(cfg, site(gpu_of[q]).gpu)[k].optimizer for q in host_kinds[k])
        for k in range(pp)
    )
    return max(0.0, z) + opt / cfg.optimizer_shard_over_dp
