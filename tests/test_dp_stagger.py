"""The staggered WAN phase of the data-parallel sync (PerfModel.dp_release_s): each stage's
exchange between sites priced from its own backward's end, the routes shared only by the
stages whose syncs overlap, each release group's longest NIC phase in series with its WAN
work (PerfModel.step, sync_staggered_s). Hand arithmetic here; brute force = CP-SAT = MILP on a case
where it moves the optimum in tests/test_solver_library.py (test_dp_stagger_moves_the_
optimum); the simulator's envelope in tests/test_simulate.py (STEP_BOUNDS)."""

from __future__ import annotations

import pytest
import solver_cases as sc

from placer.evaluate import config_of
from placer.io import plan_from_data, problem_from_data
from placer.perf.step import DP_RELEASE_GROUPS, PerfModel
from placer.sim import simulate

ROUTE = ("a", "b")


def _plan(groups: list[tuple[int, list[str]]], waves: int = 1, stage_layers=(5, 3)) -> dict:
    dp = sum(n for n, _ in groups)
    return {
        "instance": "case-part-filled",
        "parallelism": {"tp": 1, "pp": len(stage_layers), "dp": dp, "micro_batch": 1},
        "stage_layers": list(stage_layers),
        "replica_groups": [{"count": n, "stage_sites": s} for n, s in groups],
        "links": [{"sites": list(ROUTE), "waves": waves, "optic": "800zr"}],
        "sync_mode": "synchronous",
    }


def _step(prob, p, **kw):
    perf = PerfModel(prob)
    cfg = config_of(prob, plan_from_data(p))
    groups = [(g["count"], tuple(g["stage_sites"])) for g in p["replica_groups"]]
    return perf, cfg, perf.step(cfg, groups, {ROUTE: p["links"][0]["waves"]}, **kw)


def test_staggered_wan_phase_by_hand() -> None:
    """pp 2, 3 replicas at b and 2 at a, overlap off, 20 km, one wave: both stages sync
    across the route. Stage 1 is done stage 0's last backward and one gradient message
    (fabric latency + its NIC serialization) before stage 0, so the route carries stage
    1's exchange alone first: T_wan = 2 lat + max(S_0 / C, (S_0 + S_1) / C - delta_1)
    with S_k = 2 S_k / 2 per direction, where every stage's exchange at once is
    2 lat + (S_0 + S_1) / C."""
    prob = problem_from_data(sc.part_filled_instance(20.0))
    p = _plan([(3, ["b", "b"]), (2, ["a", "a"])])
    perf, cfg, st = _step(prob, p)
    cap = perf.net.capacity_Bps(ROUTE, 1, "800zr")
    s0, s1 = perf.stage_wan_bytes(cfg, 0), perf.stage_wan_bytes(cfg, 1)
    bwd0 = perf.stage_times(cfg, "h100-sxm")[0].bwd
    msg = perf.catalog.network.intra_site_latency_s + perf.message_bytes(cfg) / perf.nic_Bps(
        perf.catalog.gpus["h100-sxm"]
    )
    assert perf.dp_release_s(cfg) == pytest.approx((0.0, bwd0 + msg), rel=1e-12)
    lat = 2 * perf.net.path_latency_s(*ROUTE)
    at_once = lat + (s0 + s1) / cap
    staggered = lat + max(s0 / cap, (s0 + s1) / cap - (bwd0 + msg))
    assert st.wan_s == pytest.approx(at_once, rel=1e-12)
    assert st.wan_staggered_s == pytest.approx(staggered, rel=1e-12)
    assert staggered < at_once - 1e-4  # the case is one where the stagger matters
    # overlap off: the whole sync is exposed, after the pipeline
    assert st.step_time_s == pytest.approx(st.pipe_s + st.intra_s + staggered, rel=1e-12)
    # failure scenarios price every stage's exchange at once (placer.resilience)
    _, _, flat = _step(prob, p, stagger=False)
    assert flat.step_time_s == pytest.approx(st.pipe_s + st.intra_s + at_once, rel=1e-12)


def test_staggered_wan_phase_is_not_optimistic_against_the_simulation() -> None:
    """On the same plans the simulated step (each rank reducing when its own schedule is
    done, flows sharing the route max-min fair) is no slower than the staggered closed
    form, and closer to it than every stage's exchange at once on one wave. On two the
    WAN phase is its NIC term's (PerfModel.wan_nic_s: each stage's own members' NICs, so
    the stages' terms do not add up and the stagger gains nothing) in both."""
    prob = problem_from_data(sc.part_filled_instance(20.0))
    for waves in (1, 2):
        p = _plan([(3, ["b", "b"]), (2, ["a", "a"])], waves)
        _, _, st = _step(prob, p)
        _, _, flat = _step(prob, p, stagger=False)
        sim = simulate(prob, p)
        assert sim.closed_form_s == pytest.approx(st.step_time_s, rel=1e-12)
        assert sim.step_time_s <= st.step_time_s * (1 + 1e-9)
        if waves == 1:
            assert abs(st.step_time_s - sim.step_time_s) < abs(flat.step_time_s - sim.step_time_s)
        else:
            assert flat.step_time_s == pytest.approx(st.step_time_s, rel=1e-12)


def _nic_term_3a_2b(perf, cfg, k: int) -> float:
    """Stage k's WAN-phase NIC term with 3 members at a and 2 at b (PerfModel.wan_nic_s),
    checked by hand: each of K = 2 sites sends and receives 1/2 of its shard per round, 2
    rounds, through its members' NICs, b's 2 the slowest: 2 x S_k / 2 / (2 NICs). The
    WAN phase's bandwidth time is the larger of it and the route's."""
    nic = perf.nic_Bps(perf.catalog.gpus["h100-sxm"])
    term = perf.wan_nic_s(cfg, k, {"a": 3, "b": 2})
    assert term == pytest.approx(perf.stage_wan_bytes(cfg, k) / (2 * nic), rel=1e-12)
    return term


def test_nic_phase_per_release_group_by_hand() -> None:
    """pp 2, overlap off, 20 km, 2 waves: stage 0 split 3 at a / 2 at b (synced across the
    route; each site's members share one node, which has no NIC ring: I_0 its NVLink
    phase), stage 1's
    5 replicas at a (a node of 1: the longest NIC phase I_1, node_fill 4x). Stage 0's WAN
    phase is W_0 = max(N_0, U): N_0 its NIC term (PerfModel.wan_nic_s: b's 2 members'
    NICs carry b's half of the shard each way, the slowest), U = S_0 / C the route's load
    (stage 0 alone crosses, 2 S_0 / 2 per direction). Stage 1 is released delta_1 before
    stage 0 and runs its NIC phase under the drain (the simulator too). The group of both
    stages works max(I_1 + U, I_0 + 2 lat + max(U, N_0)): its longest NIC phase and
    busiest route in series (stage 1 syncs inside a: no latency), or stage 0's own NIC
    phase and latency in series with the route or with its NIC term (stage 1's NIC ring
    and stage 0's NIC term run on different ranks at once); so the sync is max(I_0 + 2
    lat + W_0, max(I_1 + U, I_0 + 2 lat + W_0) - delta_1), here stage 0's own group, 2
    lat + I_0 + W_0. The group's
    longest NIC phase and NIC term in series (before: max(I_0, I_1) + W_0 - delta_1)
    was 3.0 ms more; every stage's at once (failure scenarios: stagger off) is 2 lat +
    I_1 + W_0. The simulation is no slower than the closed form and closer to it than
    either."""
    prob = problem_from_data(sc.part_filled_instance(20.0))
    p = _plan([(3, ["a", "a"]), (2, ["b", "a"])], waves=2)
    perf, cfg, st = _step(prob, p)
    i0 = perf.intra_sync_s(cfg, 0, "a", members=3)
    assert perf.intra_sync_s(cfg, 0, "b", members=2) == pytest.approx(i0, rel=1e-12)
    i1 = perf.intra_sync_s(cfg, 1, "a", members=5)
    delta = perf.dp_release_s(cfg)[1]
    u = perf.stage_wan_bytes(cfg, 0) / perf.net.capacity_Bps(ROUTE, 2, "800zr")
    n0 = _nic_term_3a_2b(perf, cfg, 0)
    assert n0 > u  # two members' NICs are slower than two waves: the NIC term decides
    w0 = max(n0, u)
    lat = 2 * perf.net.path_latency_s(*ROUTE)
    # the plan's lead (as in test_wan_latency_per_release_group_by_hand): chain b -> a's
    # gradient message into stage 0 crosses the fiber, one-way latency lat / 2 more
    ends = {
        c: perf.chain_time(cfg, c, tick_s=st.route_tick_s or None) for c in (("a", "a"), ("b", "a"))
    }
    assert st.pipe_s == pytest.approx(max(ends.values()), rel=1e-12)
    tail = {("a", "a"): delta, ("b", "a"): delta + lat / 2}
    delta = st.pipe_s - max(ends[c] - tail[c] for c in tail)
    assert delta < i1  # stage 1's NIC phase is the slowest, partly hidden by its lead
    sync = lat + max(i0 + w0, max(i1 + u, i0 + n0) - delta)
    # stage 0's own group binds: the group of both is hidden by stage 1's lead
    assert sync == pytest.approx(lat + i0 + w0, rel=1e-12)
    series = lat + max(i0 + w0, max(i0, i1) + w0 - delta)  # the group's maxima in series
    assert series - sync > 2.5e-3
    assert st.intra_s == pytest.approx(i1, rel=1e-12)
    assert st.wan_s == pytest.approx(lat + w0, rel=1e-12)
    assert st.sync_staggered_s == pytest.approx(sync, rel=1e-12)
    assert st.step_time_s == pytest.approx(st.pipe_s + sync, rel=1e-12)
    _, _, flat = _step(prob, p, stagger=False)
    assert flat.step_time_s == pytest.approx(st.pipe_s + lat + i1 + w0, rel=1e-12)
    sim = simulate(prob, p)
    assert sim.closed_form_s == pytest.approx(st.step_time_s, rel=1e-12)
    assert sim.step_time_s <= st.step_time_s * (1 + 1e-9)
    assert abs(st.step_time_s - sim.step_time_s) < abs(flat.step_time_s - sim.step_time_s)
    assert st.step_time_s - sim.step_time_s < series - sync


@pytest.mark.parametrize("km", [100.0, 1000.0])
def test_wan_latency_per_release_group_by_hand(km: float) -> None:
    """pp 2, overlap off, 2 waves: stage 0's 5 replicas at a (a node of 1: the longest NIC
    phase, I_0), stage 1 split 3 at a / 2 at b (synced across the route). Stage 0, released
    last (delta 0), syncs inside a and pays no WAN latency; stage 1's two WAN rounds start
    delta_1 earlier. The sync is max(I_0, W - delta_1), W = max(I_0 + U, I_1 + 2 lat +
    max(U, N_1)) the group of both stages' work: its longest NIC phase and busiest route
    U in series (stage 0's ranks have no WAN round, so no latency there), or stage 1's own
    NIC phase and latency in series with the route or with its NIC term N_1
    (PerfModel.step). Before, the group's longest NIC phase, I_0, was in series with
    stage 1's latency too: max(I_0, max(I_0 + U, I_1 + N_1) + 2 lat - delta_1); before
    that the latency was charged to every group: 2 lat + max(I_0, max(I_0, I_1) + U -
    delta_1). delta_1 is the plan's: T_pipe less the
    latest T_c - tail_c over the two chains, the crossing chain's tail holding the fiber's
    one-way latency (hand arithmetic below). At 100 and 1,000 km the drain hides stage 1's
    whole sync (the step is T_pipe + I_0); the rule before did not at 1,000 km. The
    simulation is no slower than the closed form and closer to it than both old charges
    (at 1,000 km equal to it up to rounding)."""
    prob = problem_from_data(sc.part_filled_instance(km))
    p = _plan([(3, ["a", "a"]), (2, ["a", "b"])], waves=2)
    perf, cfg, st = _step(prob, p)
    i0 = perf.intra_sync_s(cfg, 0, "a", members=5)
    i1 = max(perf.intra_sync_s(cfg, 1, s, members=n) for s, n in (("a", 3), ("b", 2)))
    u = perf.stage_wan_bytes(cfg, 1) / perf.net.capacity_Bps(ROUTE, 2, "800zr")
    n1 = _nic_term_3a_2b(perf, cfg, 1)
    w = max(n1, u)
    lat = 2 * perf.net.path_latency_s(*ROUTE)
    # the group of both stages: I_0 + U, or stage 1's NIC phase and latency with U or N_1
    both = max(i0 + u, i1 + lat + w)
    assert lat == pytest.approx(2 * km * 4.9e-6, rel=1e-12)
    assert i1 < i0  # stage 0's node of 1 is the longest NIC phase
    # stage 1's release (PerfModel.step, the plan's): each chain is done with stage 1 its
    # own tail before its end, stage 0's last backward and the gradient message into it
    # (fabric hop + NIC serialization, plus the fiber's one-way latency where it crosses)
    bwd0 = perf.chunk_times(cfg, "h100-sxm")[0].bwd
    fabric = perf.catalog.network.intra_site_latency_s
    tx = perf.message_bytes(cfg) / perf.nic_Bps(perf.catalog.gpus["h100-sxm"])
    tail = {("a", "a"): bwd0 + fabric + tx, ("a", "b"): bwd0 + fabric + tx + lat / 2}
    for chain, t in tail.items():
        assert perf.chain_offsets_s(cfg, chain, "bwd") == pytest.approx((0.0, t), rel=1e-12)
    ends = {c: perf.chain_time(cfg, c, tick_s=st.route_tick_s or None) for c in tail}
    assert st.pipe_s == pytest.approx(max(ends.values()), rel=1e-12)
    delta = st.pipe_s - max(ends[c] - tail[c] for c in tail)
    # never less than the configuration's constant (a message inside a site)
    assert delta >= perf.dp_release_s(cfg)[1] == pytest.approx(bwd0 + fabric + tx, rel=1e-12)
    sync = max(i0, both - delta)
    before = max(i0, max(i0 + u, i1 + n1) + lat - delta)
    old = lat + max(i0, max(i0, i1) + w - perf.dp_release_s(cfg)[1])
    # the drain hides stage 1's whole sync at both distances: the step is T_pipe + I_0,
    # where the rule before charged stage 1's latency after I_0 at 1,000 km
    assert sync == pytest.approx(i0, rel=1e-12)
    assert both - delta < i0
    if km == 1000.0:
        assert before - sync > 1e-3
    assert st.sync_staggered_s == pytest.approx(sync, rel=1e-12)
    assert st.step_time_s == pytest.approx(st.pipe_s + sync, rel=1e-12)
    sim = simulate(prob, p)
    assert sim.closed_form_s == pytest.approx(st.step_time_s, rel=1e-12)
    assert sim.step_time_s <= st.step_time_s * (1 + 1e-9)
    assert abs(st.step_time_s - sim.step_time_s) < abs(st.pipe_s + old - sim.step_time_s)
    assert abs(st.step_time_s - sim.step_time_s) <= abs(st.pipe_s + before - sim.step_time_s)


def _zero1_step(perf, cfg, st, gather: float, lat: float, sync: float | None = None) -> float:
    """ZeRO-1 with overlap: T_pipe plus each half's exposed part, f (S + R lat) - window
    (PerfModel.dp_pieces, R = dp_lat_repeats; `lat` 0 with release groups, whose works
    carry their own stages' repeats), the reduce-scatter at the staggered sync (`sync`,
    default the plan's), the gather at `gather`."""
    (f0, w0), (f1, w1) = perf.dp_pieces(cfg)
    r0, r1 = perf.dp_lat_repeats(cfg)
    assert perf.dp_staggered(cfg) == (True, False)
    sync = st.sync_staggered_s if sync is None else sync
    reduce_part = max(0.0, f0 * (sync + r0 * lat) - w0)
    return st.pipe_s + reduce_part + max(0.0, f1 * (gather + r1 * lat) - w1)


def _without_own_repeats(monkeypatch, prob, p):
    """The step as priced before each release group carried its own stages' latency
    repeats (PerfModel.dp_stage_repeats): the groups' works without them, and every
    bucketed piece R T_lat, the most buckets of any rank at the slowest pair's latency."""
    with monkeypatch.context() as m:
        m.setattr(PerfModel, "dp_stage_repeats", lambda self, cfg: (0,) * cfg.pp)
        perf, cfg, st = _step(prob, p)
    lat = 2 * perf.net.path_latency_s(*ROUTE)
    return _zero1_step(perf, cfg, st, st.gather_staggered_s, lat)


@pytest.mark.parametrize("km", [100.0, 1000.0])
def test_parameter_gather_per_release_group_by_hand(km: float, monkeypatch) -> None:
    """pp 2, job.overlap on (ZeRO-1: the reduce-scatter half under the last backward, the
    parameter all-gather half under the first forward of the step), 2 waves: stage 0's 5
    replicas at a (I_0 the longest NIC phase), stage 1 split 3 at a / 2 at b. Every rank
    starts its gather with the step, and rank 1's first forward runs phi_1 later (the
    plan's: T_pipe less the latest T_c - head_c, head_c stage 0's first forward and the
    chain's own activation message, across the fiber for a -> b), so the gather
    is max(I_0, max(I_0 + U, I_1 + 2 lat + max(U, N_1)) - 2 phi_1) (stage 0 synced inside
    a, no WAN term; the group of both stages' work as in
    test_wan_latency_per_release_group_by_hand;
    the gather, half the sync, gains its whole head start phi_1: PerfModel.dp_credit_scale),
    against I_0 + 2 lat + max(U, N_1) with every stage's at once (before). Each bucket of a
    stage's half pays its own pairs' latency again, R_k = its buckets - 1 times
    (PerfModel.dp_stage_repeats: 7 and 5 here): stage 0 syncs inside a and repeats
    nothing, so the group of stage 0 alone carries no repeats and stage 1's terms of the
    group of both R_1 lat: the gather is max(I_0, max(I_0 + U, I_1 + (1 + R_1) lat +
    max(U, N_1)) - 2 phi_1) (before, max(I_0, max(I_0 + U, I_1 + N_1) + (1 + R_1) lat -
    2 phi_1): stage 0's NIC phase in series with stage 1's latency and repeats). The
    step is T_pipe plus each piece's exposed part, f S - window (PerfModel.dp_pieces), the
    reduce-scatter at the staggered sync, the gather at this. The simulation is within 1%
    (+0.1% at 100 km, -0.7% at 1,000 km), and closer than with the gather at once, than
    every bucketed piece paying R lat with R the most buckets of any rank (7, stage 0's,
    at stage 1's latency), and than stage 0's NIC phase in series with stage 1's latency
    and repeats (before)."""
    prob = problem_from_data(sc.part_filled_instance(km, overlap=True))
    p = _plan([(3, ["a", "a"]), (2, ["a", "b"])], waves=2)
    perf, cfg, st = _step(prob, p)
    assert cfg.zero1 and cfg.overlap_param_gather
    i0 = perf.intra_sync_s(cfg, 0, "a", members=5)
    i1 = max(perf.intra_sync_s(cfg, 1, s, members=n) for s, n in (("a", 3), ("b", 2)))
    u = perf.stage_wan_bytes(cfg, 1) / perf.net.capacity_Bps(ROUTE, 2, "800zr")
    n1 = _nic_term_3a_2b(perf, cfg, 1)
    w = max(n1, u)
    lat = 2 * perf.net.path_latency_s(*ROUTE)
    both = max(i0 + u, i1 + lat + w)
    fwd0 = perf.chunk_times(cfg, "h100-sxm")[0].fwd
    fabric = perf.catalog.network.intra_site_latency_s
    tx = perf.message_bytes(cfg) / perf.nic_Bps(perf.catalog.gpus["h100-sxm"])
    assert perf.dp_fill_s(cfg) == pytest.approx((0.0, fwd0 + fabric + tx), rel=1e-12)
    # the plan's: rank 1's first forward comes each chain's own head after its start
    # (stage 0's first forward and the activation message, across the fiber for a -> b),
    # exposed only past the chain's slack T_pipe - T_c: phi_1 = T_pipe - max (T_c - head_c)
    head = {("a", "a"): fwd0 + fabric + tx, ("a", "b"): fwd0 + fabric + tx + lat / 2}
    for chain, h in head.items():
        assert perf.chain_offsets_s(cfg, chain, "fwd") == pytest.approx((0.0, h), rel=1e-12)
    ends = {c: perf.chain_time(cfg, c, tick_s=st.route_tick_s or None) for c in head}
    phi1 = st.pipe_s - max(ends[c] - head[c] for c in head)
    assert phi1 >= fwd0 + fabric + tx
    assert i1 < i0 and 0 < phi1 < lat + w  # the gather's WAN part is partly hidden
    # the gather is half the sync (f = 1/2) and starts with the step, so it gains its whole
    # head start: S carries twice it (PerfModel.dp_credit_scale), f S the head start once
    assert perf.dp_credit_scale(cfg) == (2, 2)
    # the whole head start hides the WAN part's bandwidth and one latency (stage 0's NIC
    # phase is left), where half of it (before) did not
    assert both - 2 * phi1 < i0
    r0, r1 = perf.dp_stage_repeats(cfg)
    assert (r0, r1) == (7, 5) and perf.dp_lat_repeats(cfg) == (7, 7)
    assert perf.dp_repeat_share(cfg) == (1.0, 1.0)  # both halves bucketed
    gather = max(i0, max(i0 + u, i1 + (1 + r1) * lat + w) - 2 * phi1)
    # at 1,000 km stage 1's repeats are not all hidden by its head start, at 100 km they are
    assert (gather > i0) == (km == 1000.0)
    assert st.gather_staggered_s == pytest.approx(gather, rel=1e-12)
    series = max(i0, max(i0 + u, i1 + n1) + (1 + r1) * lat - 2 * phi1)
    assert series > gather
    before_series = _zero1_step(perf, cfg, st, series, 0.0)  # the gather as before
    at_once = st.intra_s + st.wan_s
    assert at_once == pytest.approx(i0 + lat + w, rel=1e-12)
    assert st.step_time_s == pytest.approx(_zero1_step(perf, cfg, st, gather, 0.0), rel=1e-12)
    before = _zero1_step(perf, cfg, st, at_once + r1 * lat, 0.0)
    assert st.step_time_s < before
    old = _without_own_repeats(monkeypatch, prob, p)
    assert st.step_time_s < old
    sim = simulate(prob, p)
    assert sim.closed_form_s == pytest.approx(st.step_time_s, rel=1e-12)
    assert abs(st.step_time_s - sim.step_time_s) < abs(before - sim.step_time_s)
    assert abs(st.step_time_s - sim.step_time_s) < abs(old - sim.step_time_s)
    assert abs(st.step_time_s - sim.step_time_s) < abs(before_series - sim.step_time_s)
    assert abs(st.step_time_s - sim.step_time_s) < 0.01 * sim.step_time_s  # -0.7% at 1,000 km


def test_gathers_share_every_stages_routes_by_hand(monkeypatch) -> None:
    """pp 2, job.overlap on (ZeRO-1's gather from the step's start), 1,000 km, 1 wave, both
    stages split 3 at a / 2 at b. Every rank starts its gather with the step and the
    route shares their bytes (placer.sim: max-min fair), so stage 0's, needed first (no
    head start), waits for both stages' bytes: its gather is I_0 + 2 lat + max(U_01, N_0),
    U_01 both stages' bytes over the route, where the route with stage 0's bytes alone,
    U_0, gave the rank needed first a route of its own (before), plus its own latency
    repeats, R_0 lat (PerfModel.dp_stage_repeats: stage 0's 8 buckets; the group of both
    stages the larger of R_0 and R_1 = 5 at the same latency). The simulation is closer
    to it than to that."""
    prob = problem_from_data(sc.part_filled_instance(1000.0, overlap=True))
    p = _plan([(3, ["a", "a"]), (2, ["b", "b"])], waves=1)
    perf, cfg, st = _step(prob, p)
    assert cfg.zero1 and cfg.overlap_param_gather
    i0 = max(perf.intra_sync_s(cfg, 0, s, members=n) for s, n in (("a", 3), ("b", 2)))
    i1 = max(perf.intra_sync_s(cfg, 1, s, members=n) for s, n in (("a", 3), ("b", 2)))
    cap = perf.net.capacity_Bps(ROUTE, 1, "800zr")
    # K = 2 sites: each sends and receives S_k / 2 a round, 2 rounds: S_k on the route
    u0 = perf.stage_wan_bytes(cfg, 0) / cap
    u01 = (perf.stage_wan_bytes(cfg, 0) + perf.stage_wan_bytes(cfg, 1)) / cap
    n0, n1 = _nic_term_3a_2b(perf, cfg, 0), _nic_term_3a_2b(perf, cfg, 1)
    lat = 2 * perf.net.path_latency_s(*ROUTE)
    assert i1 <= i0 and n1 <= n0 and u0 <= n0 < u01  # the shared route binds
    r0, r1 = perf.dp_stage_repeats(cfg)
    assert (r0, r1) == (7, 5)
    gather = i0 + (1 + r0) * lat + max(u01, n0)
    assert st.gather_staggered_s == pytest.approx(gather, rel=1e-12)
    # (the group of both stages, released phi_1 later, has the same work: not above it)
    assert st.step_time_s == pytest.approx(_zero1_step(perf, cfg, st, gather, 0.0), rel=1e-12)
    own = i0 + (1 + r0) * lat + max(u0, n0)  # before: stage 0's bytes alone
    before = _zero1_step(perf, cfg, st, own, 0.0)
    sim = simulate(prob, p)
    assert sim.closed_form_s == pytest.approx(st.step_time_s, rel=1e-12)
    assert abs(st.step_time_s - sim.step_time_s) < abs(before - sim.step_time_s)
    # both stages synced across, R_0 the most buckets: the old charge is the new one here
    assert _without_own_repeats(monkeypatch, prob, p) == pytest.approx(st.step_time_s, rel=1e-9)


def test_release_groups() -> None:
    """Prefix groups by stage index, each stage released at its group's first stage's
    offset (a later release: pessimistic); no stagger with one stage or one replica, or
    outside the synchronous sync."""
    inst = sc.part_filled_instance(20.0)
    inst["job"]["model"] = dict(inst["job"]["model"], layers=16)
    inst["job"]["parallelism"]["pp"] = [8]
    inst["job"]["gpus"] = 40
    inst["sites"] = [dict(s, gpus=40) for s in inst["sites"]]
    prob = problem_from_data(inst)
    perf = PerfModel(prob)
    p = _plan([(3, ["b"] * 8), (2, ["a"] * 8)], stage_layers=(2,) * 8)
    cfg = config_of(prob, plan_from_data(p))
    rel = perf.dp_release_s(cfg)
    bwd = [t.bwd for t in perf.stage_times(cfg, "h100-sxm")]
    msg = perf.catalog.network.intra_site_latency_s + perf.message_bytes(cfg) / perf.nic_Bps(
        perf.catalog.gpus["h100-sxm"]
    )
    assert DP_RELEASE_GROUPS == 4
    first = [0, 0, 2, 2, 4, 4, 6, 6]
    assert rel == pytest.approx([sum(bwd[:f]) + f * msg for f in first], rel=1e-12)
    assert len(set(rel)) == 4
    # fewer than two replicas, or an outer (DiLoCo) exchange: every stage's at once
    inst1 = dict(inst, job=dict(inst["job"], sync={"mode": "diloco", "every_steps": 8}))
    prob1 = problem_from_data(inst1)
    cfg1 = config_of(prob1, plan_from_data(dict(p, sync_mode="diloco")))
    assert PerfModel(prob1).dp_release_s(cfg1) == (0.0,) * 8


@pytest.mark.parametrize("one_site_chains", [True, False])
@pytest.mark.parametrize("stage_layers", [(2, 2, 2, 2), (1, 3, 3, 1), (3, 1, 1, 3)])
def test_series_stages_keep_every_stages_series(
    stage_layers: tuple[int, ...], one_site_chains: bool
) -> None:
    """The formulations write each release group's per-stage series (NIC phase + latency
    + WAN NIC term, PerfModel.step) only for the stages of a class that no other dominates
    (InnerData.series_stages). By enumeration over every member count at every hosting
    site: the largest series over those stages is the largest over all the class's
    stages in the group (a stage the filter drops never binds), and a class whose stages
    can cross sites keeps at least one. With chains inside one site every stage is one
    class (the filter's work: the LM-head stage dominates the embedding's at 2/2/2/2,
    the inner stages the outer ones at 1/3/3/1); with two-site chains each stage is
    its own."""
    import itertools

    from placer.optimize.data import build_inner
    from placer.optimize.space import chain_types
    from placer.rules import config_of as rules_config_of

    inst = sc.part_filled_instance(20.0)
    if one_site_chains:
        inst.setdefault("solver", {})["max_sites_per_replica"] = 1
    prob = problem_from_data(inst)
    p = _plan([(3, ["a"] * 4), (2, ["b"] * 4)], waves=1, stage_layers=stage_layers)
    perf = PerfModel(prob)
    cfg = rules_config_of(prob, plan_from_data(p))
    d = build_inner(prob, perf, cfg, chain_types(prob, perf, cfg))
    assert len(d.release_groups) >= 2  # staggered: the series terms exist
    assert (len(d.stage_classes) == 1) == one_site_chains
    checked = 0
    for cls in d.stage_classes:
        hosts = d.stage_sites[cls[0]]
        for g in d.release_groups:
            ks = d.group_stages(cls, g)
            reps = d.series_stages(cls, g)
            assert set(reps) <= set(ks)
            if len(hosts) < 2:
                assert reps == []
                continue
            nic_ks = [k for k in ks if any(d.wan_nic[(k, s)] > 0 for s in hosts)]
            if not nic_ks:  # I_k + L_k never exceeds the group's I + L: no series term
                assert reps == []
                continue
            assert reps

            def series(k: int, x: dict[str, int]) -> float:
                on = [s for s in x if x[s] > 0]
                K = len(on)
                i = max(
                    d.intra_fill[(k, s)][x[s]] if (k, s) in d.intra_fill else d.intra[(k, s)]
                    for s in on
                )
                n = max(((K - 1) / K * d.wan_nic[(k, s)] / x[s] for s in on), default=0.0)
                return i + n

            for counts in itertools.product(range(cfg.dp + 1), repeat=len(hosts)):
                x = dict(zip(hosts, counts, strict=True))
                if sum(counts) != cfg.dp or sum(c > 0 for c in counts) < 2:
                    continue
                full = max(series(k, x) for k in nic_ks)
                assert max(series(k, x) for k in reps) == pytest.approx(full, rel=1e-12)
                checked += 1
    assert checked > 0, "no class can cross sites with a NIC term"
