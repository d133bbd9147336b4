"""The whole-job simulator (placer.sim) against hand arithmetic, and the closed form
(placer.perf.step) against the simulator.

Hand-arithmetic oracles: max-min fair rates and flow finish times (c); R replicas sharing
one route at a tick (b); the hierarchical sync of an unbalanced placement, DiLoCo's outer
exchange, the interleaved bubble. Where the closed form should be exact (one site, one
replica, links so wide there is no contention) the two agree (a). On random multi-site
plans (d) the simulated pipeline lies between the closed form's T_pipe and the same
chains re-timed with every route shared by its crossings, the closed form's pipeline
is within 7% of it, and the whole step within 2% where both price the same sync (one
site per stage, part-filled nodes included). Hierarchical sync and the overlap windows
by hand: the NVLink + NIC phases, a part-filled node (its NIC shares, node_fill),
buckets that hide all but the last, part, or none of the sync, the last rank hiding its
sync under the drain, ZeRO-1's gather under the first forward.
"""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sim_cases import SMALL_MODEL, dp_sync_class, plan, problem
from typer.testing import CliRunner

from placer.cli import app
from placer.errors import InputError
from placer.evaluate import config_of
from placer.io import plan_from_data
from placer.perf.step import PerfModel
from placer.sim import Fabric, SimOptions, max_min_fair, schedule, simulate

FIBER_S_PER_KM = 4.9e-6  # catalog network.fiber_us_per_km
INTRA_S = 5e-6  # catalog network.intra_site_latency_s
WAVE_BPS = 800e9 / 8 * 0.9  # one 800ZR wave, payload efficiency 0.9


def _nvl_Bps(prob) -> float:
    gpu = prob.catalog.gpus["h100-sxm"]
    return gpu.nvlink_gbytes_per_s_bidir / 2 * 1e9 * prob.catalog.network.nvlink_efficiency


def _nic_Bps(prob, tp: int) -> float:
    gpu = prob.catalog.gpus["h100-sxm"]
    return gpu.nic_gbps * 1e9 / 8 * prob.catalog.network.nic_efficiency * tp


# ----------------------------------------------------------------------------- (c) fairness


def test_max_min_fair_matches_hand_allocation() -> None:
    # L1 (10) carries A and B, L2 (4) carries B and C: L2 saturates first at 2 each,
    # then A takes what B leaves on L1: 10 - 2 = 8.
    rates = max_min_fair({"A": ["L1"], "B": ["L1", "L2"], "C": ["L2"]}, {"L1": 10.0, "L2": 4.0})
    assert rates == pytest.approx({"A": 8.0, "B": 2.0, "C": 2.0}, rel=1e-12)
    # three links in a row, a long flow over all and one local flow on each:
    # L2 (3) saturates at 1.5 each, then L1 (6) and L3 (9) give the rest to their locals
    rates = max_min_fair(
        {"long": ["L1", "L2", "L3"], "a": ["L1"], "b": ["L2"], "c": ["L3"]},
        {"L1": 6.0, "L2": 3.0, "L3": 9.0},
    )
    assert rates == pytest.approx({"long": 1.5, "a": 4.5, "b": 1.5, "c": 7.5}, rel=1e-12)
    # no bottleneck shared: each gets its own link's capacity; no link: unbounded
    assert max_min_fair({"x": ["L1"], "y": ["L2"], "z": []}, {"L1": 1.0, "L2": 2.0}) == {
        "x": 1.0,
        "y": 2.0,
        "z": math.inf,
    }


def test_fabric_recomputes_rates_at_every_arrival_and_departure() -> None:
    """One link of 10 B/s. A (30 B) at t=0, B (10 B) at t=1, C (5 B) on the link plus a
    private 1 B/s link at t=2. Hand timeline: [0,1) A alone at 10 (20 left); [1,2) A and
    B at 5 (A 15, B 5 left); [2,..) C is held to 1 by its private link, A and B share the
    other 9: 4.5 each, B ends at 2 + 5/4.5; then A gets 9 until C ends at 2 + 5 = 7."""
    import simpy

    env = simpy.Environment()
    fab = Fabric(env)
    fab.add_link("L", 10.0)
    fab.add_link("P", 1.0)
    done: dict[str, float] = {}

    def flow(name: str, at: float, nbytes: float, path: list[str]):
        yield env.timeout(at)
        yield fab.transfer(nbytes, path)
        done[name] = env.now

    env.process(flow("A", 0, 30, ["L"]))
    env.process(flow("B", 1, 10, ["L"]))
    env.process(flow("C", 2, 5, ["L", "P"]))
    env.run()
    t_b = 2 + 5 / 4.5
    a_left = 15 - 4.5 * (t_b - 2)
    assert done["B"] == pytest.approx(t_b, rel=1e-12)
    assert done["A"] == pytest.approx(t_b + a_left / 9.0, rel=1e-12)
    assert done["C"] == pytest.approx(7.0, rel=1e-12)
    fab.close()
    assert fab.links["L"].bytes == pytest.approx(45.0, rel=1e-12)
    assert fab.links["L"].peak_Bps == pytest.approx(10.0, rel=1e-12)


def test_fabric_finish_timers_across_components_and_ties() -> None:
    """The fabric keeps one timer at the earliest finish (placer.sim.fabric): a flow that
    starts later on another link but ends first gets its own earlier finish, the timer set
    for the later one still fires once, and two flows due at the same instant end at that
    instant together. Link X (1 B/s): D (10 B) at t=0, due at 10. Link Y (2 B/s): E (2 B)
    at t=3, due at 4. Link Z (4 B/s): F and G (8 B each) at t=5 share it at 2, both due at
    9, before D. Then H (1 B) on X at t=9.5 halves D's rate: D has 0.5 B left at 0.5 B/s
    and ends at 10.5, not at 10 as first set; H has 0.5 B left then, alone: 11."""
    import simpy

    env = simpy.Environment()
    fab = Fabric(env)
    fab.add_link("X", 1.0)
    fab.add_link("Y", 2.0)
    fab.add_link("Z", 4.0)
    done: dict[str, list[float]] = {}

    def flow(name: str, at: float, nbytes: float, path: list[str]):
        yield env.timeout(at)
        yield fab.transfer(nbytes, path)
        done.setdefault(name, []).append(env.now)

    env.process(flow("D", 0, 10, ["X"]))
    env.process(flow("E", 3, 2, ["Y"]))
    env.process(flow("F", 5, 8, ["Z"]))
    env.process(flow("G", 5, 8, ["Z"]))
    env.process(flow("H", 9.5, 1, ["X"]))
    env.run()
    assert done["E"] == [pytest.approx(4.0, rel=1e-12)]
    assert done["F"] == done["G"] == [pytest.approx(9.0, rel=1e-12)]
    assert done["D"] == [pytest.approx(10.5, rel=1e-12)]  # once, not at 10 as first set
    assert done["H"] == [pytest.approx(11.0, rel=1e-12)]
    fab.close()
    assert fab.links["X"].bytes == pytest.approx(11.0, rel=1e-12)


# ----------------------------------------------------------------------------- (b) lockstep


@pytest.mark.parametrize("m", [1, 4])
def test_replicas_share_the_route_at_every_tick(m: int) -> None:
    """R replicas, stage 0 at site a, stage 1 at b, over a route of capacity C: every
    replica's activation of a tick leaves at the same moment, so each message takes
    R M / C + latency (not M / NIC + latency). The closed form prices the same tick
    (issue 11 item 1); with staggered replicas it keeps the step-average bound only."""
    r_count, km, gbps = 16, 200.0, 100.0
    prob = problem(["a", "b"], [("a", "b", km)], global_batch=r_count * m, capacity_gbps=gbps)
    p = plan(8, [4, 4], [(r_count, ["a", "b"])], m)
    res = simulate(prob, p)
    msg = 1 * SMALL_MODEL["seq_len"] * SMALL_MODEL["hidden"] * 2
    cap = gbps * 1e9 / 8 * 0.9
    assert msg / _nic_Bps(prob, 8) < r_count * msg / cap  # the route, not the NIC, binds
    lat = INTRA_S + km * FIBER_S_PER_KM
    cross = [t for t in res.transfers if t.cross_site]
    assert len(cross) == 2 * r_count * m
    for t in cross:
        assert t.sent - t.start == pytest.approx(r_count * msg / cap, rel=1e-9)
        assert t.arrival - t.sent == pytest.approx(lat, rel=1e-9)
    assert res.closed_pipe_s == pytest.approx(res.pipe_s, rel=1e-9)
    if m == 1:
        st = PerfModel(prob).stage_times(_config(prob, p), "h100-sxm")
        compute = st[0].fwd + st[1].fwd + st[1].bwd + st[0].bwd
        # then the optimizer step of the slowest stage over its ZeRO-1 shard
        opt = PerfModel(prob).optimizer_step_s(_config(prob, p), ("a", "b"))
        assert res.pipe_s == pytest.approx(
            compute + 2 * (r_count * msg / cap + lat) + opt, rel=1e-9
        )
        # staggered: the same chain with one message at the NIC rate, or the route's bytes
        # per step over its capacity, whichever is larger
        stag = problem(
            ["a", "b"],
            [("a", "b", km)],
            global_batch=r_count * m,
            capacity_gbps=gbps,
            replica_schedule="staggered",
        )
        staggered = simulate(stag, p).closed_pipe_s
        chain = compute + 2 * (msg / _nic_Bps(prob, 8) + lat) + opt
        assert staggered == pytest.approx(max(chain, r_count * msg / cap), rel=1e-9)
        assert staggered < res.pipe_s - r_count * msg / cap
    assert res.routes[0]["peak_utilisation"] == pytest.approx(1.0, rel=1e-9)


def _config(prob, p):
    return config_of(prob, plan_from_data(p))


# ----------------------------------------------------------------------------- (a) exact cases


def test_single_site_pipeline_is_the_closed_form_and_its_sync_is_no_slower() -> None:
    prob = problem(["a"], [], global_batch=64)
    res = simulate(prob, plan(8, [2, 2, 2, 2], [(8, ["a"] * 4)], 8))
    assert res.pipe_s == pytest.approx(res.closed_pipe_s, rel=1e-9)
    # each rank syncs once its own backward is done, the closed form after the last
    # rank's: the simulation can only be faster, by at most the pipeline's drain
    assert res.closed_pipe_s <= res.step_time_s <= res.closed_form_s * (1 + 1e-9)
    # no pipeline: the sync starts when everyone is done in both, so they agree
    one = simulate(prob, plan(8, [8], [(8, ["a"])], 8))
    assert one.step_time_s == pytest.approx(one.closed_form_s, rel=0.02)
    assert one.step_time_s == pytest.approx(one.closed_form_s, rel=1e-6)


def test_one_replica_across_three_sites_is_the_closed_form() -> None:
    # tp 1: one NIC (45 GB/s) is narrower than the wave (90 GB/s), as the closed form assumes
    prob = problem(["a", "b", "c"], [("a", "b", 300.0), ("b", "c", 800.0)], global_batch=8)
    res = simulate(
        prob, plan(1, [2, 2, 2, 2], [(1, ["a", "b", "b", "c"])], 8, {("a", "b"): 1, ("b", "c"): 1})
    )
    assert res.step_time_s == pytest.approx(res.closed_form_s, rel=0.02)
    # not exact: stage 1's NIC takes activations from a and gradients from stage 2 and
    # they sometimes arrive together (the closed form gives each direction its own NIC)
    assert res.step_time_s >= res.closed_form_s * (1 - 1e-9)
    # with the NIC out of the way (tp 8), the chain is the closed form's to rounding
    wide = simulate(
        prob, plan(8, [2, 2, 2, 2], [(1, ["a", "b", "b", "c"])], 8, {("a", "b"): 8, ("b", "c"): 8})
    )
    assert wide.step_time_s == pytest.approx(wide.closed_form_s, rel=1e-6)


def test_links_so_wide_that_nobody_waits_give_the_closed_form_pipeline() -> None:
    prob = problem(["a", "b"], [("a", "b", 500.0)], global_batch=64 * 4, capacity_gbps=1e7)
    res = simulate(
        prob, plan(8, [2, 2, 2, 2], [(32, ["a", "a", "b", "b"]), (32, ["b", "b", "a", "a"])], 4)
    )
    assert res.pipe_s == pytest.approx(res.closed_pipe_s, rel=0.02)
    assert res.pipe_s == pytest.approx(res.closed_pipe_s, rel=1e-9)
    assert res.closed_pipe_s <= res.step_time_s <= res.closed_form_s * (1 + 1e-9)


# ----------------------------------------------------------------------------- sync by hand


def test_unbalanced_sync_the_lone_member_carries_the_whole_exchange() -> None:
    """pp 1, tp 1, 7 replicas at a and 1 at b, a route so wide it never binds. Hand
    timeline: a's 7 share one node (8 GPUs), so they reduce-scatter over NVLink (6/7 G,
    no NIC phase); two WAN rounds in which b's one member receives S/2 through its NIC
    (+ the fiber each); all-gather at a over NVLink. The closed form's WAN phase has the
    same NIC term (PerfModel.wan_nic_s: (K - 1)/K 2 S / n at b, n = 1); it prices a's
    NVLink ring as the node's 8 (7/8 G, not 6/7): a little pessimistic. (Before that
    term it priced a balanced exchange and was optimistic here.)"""
    km = 400.0
    prob = problem(["a", "b"], [("a", "b", km)], global_batch=8, capacity_gbps=1e7)
    p = plan(1, [8], [(7, ["a"]), (1, ["b"])], 1)
    res = simulate(prob, p)
    perf = PerfModel(prob)
    g = perf.stage_grad_bytes(_config(prob, p), 0)  # = S: tp 1, 16 bits
    nic, nvl = _nic_Bps(prob, 1), _nvl_Bps(prob)
    expect = 2 * (6 / 7 * g / nvl) + 2 * (g / 2 / nic + km * FIBER_S_PER_KM)
    assert res.step_time_s - res.pipe_s == pytest.approx(expect, rel=1e-9)
    cfg = _config(prob, p)
    assert perf.wan_nic_s(cfg, 0, {"a": 7, "b": 1}) == pytest.approx(g / nic, rel=1e-9)
    closed = 2 * (7 / 8 * g / nvl) + 2 * (g / 2 / nic + km * FIBER_S_PER_KM)
    assert res.closed_form_s - res.pipe_s == pytest.approx(closed, rel=1e-9)
    assert res.closed_form_s > res.step_time_s


def test_hierarchical_sync_inside_a_site_by_hand() -> None:
    """pp 1, tp 2: 4 replicas' devices share a node of 8 GPUs, 8 replicas are 2 nodes.
    NCCL's hierarchical all-reduce (reduce inside the node, all-reduce between nodes by
    one ring per NIC, broadcast inside: NVIDIA/nccl#530; the tree/NVLS-tree algorithms
    NCCL picks at small node counts, NVIDIA/nccl-tests#196): per GPU 2 x 3/4 G over
    NVLink, then 2 x 1/2 x G/4 over its NIC with 1 + 1 hop latencies. The closed form's
    intra_sync_s is the same sum when the site holds all d replicas."""
    prob = problem(["a"], [], global_batch=8)
    p = plan(2, [8], [(8, ["a"])], 1)
    res = simulate(prob, p)
    perf = PerfModel(prob)
    cfg = _config(prob, p)
    g = perf.stage_grad_bytes(cfg, 0)
    nic, nvl = _nic_Bps(prob, 1), _nvl_Bps(prob)
    expect = 2 * (3 / 4 * g / nvl) + 2 * (1 / 2 * g / 4 / nic + INTRA_S)
    assert res.step_time_s - res.pipe_s == pytest.approx(expect, rel=1e-9)
    assert perf.intra_sync_s(cfg, 0, "a") == pytest.approx(expect, rel=1e-9)
    assert res.step_time_s == pytest.approx(res.closed_form_s, rel=1e-9)
    # 5 replicas: nodes of 4 and 1. The lone member holds all 4 node shards, so its NIC
    # moves 4 x G/4 in each ring phase (NCCL's rings cross each node boundary once per
    # channel, all through that node's one NIC); the closed form prices it by the site's
    # fill (node_fill: ceil(4 / 1) = 4 on the bandwidth term, the hop latencies once)
    p5 = plan(2, [8], [(5, ["a"])], 1)
    res5 = simulate(problem(["a"], [], global_batch=5), p5)
    lone = 2 * (3 / 4 * g / nvl) + 2 * (1 / 2 * g / nic + INTRA_S)
    assert res5.step_time_s - res5.pipe_s == pytest.approx(lone, rel=1e-9)
    assert res5.closed_breakdown["dp_sync_s"] == pytest.approx(lone, rel=1e-9)


@pytest.mark.parametrize(
    ("replicas", "fill"), [(4, 0), (5, 4), (6, 2), (7, 2), (8, 1), (11, 2), (12, 1), (13, 4)]
)
def test_part_filled_node_by_hand(replicas: int, fill: int) -> None:
    """pp 1, tp 2 on nodes of 8 GPUs: q = 4 replicas a node. With n replicas at the site,
    N = ceil(n / 4) nodes and r = n mod 4 on the last, each member's NIC moves (in each of
    the two ring phases) (N - 1)/N x G/4 per shard ring it carries: one in a full node,
    ceil(4 / r) on the part-filled one, none when N = 1; plus (N - 1) hop latencies a
    phase. NVLink: 2 x 3/4 G (a full node's ring; 2 x (n-1)/n G when n < 4, the closed
    form charging the full node's). The simulation and the closed form both give it."""
    prob = problem(["a"], [], global_batch=replicas)
    p = plan(2, [8], [(replicas, ["a"])], 1)
    res = simulate(prob, p)
    perf, cfg = PerfModel(prob), _config(prob, p)
    g = perf.stage_grad_bytes(cfg, 0)
    nic, nvl = _nic_Bps(prob, 1), _nvl_Bps(prob)
    nodes = math.ceil(replicas / 4)
    nic_s = 0.0 if nodes == 1 else 2 * (fill * (nodes - 1) / nodes * g / 4 / nic)
    nic_s += 2 * (nodes - 1) * INTRA_S
    q = min(4, replicas)
    sim_nvl = 2 * (q - 1) / q * g / nvl
    assert res.step_time_s - res.pipe_s == pytest.approx(sim_nvl + nic_s, rel=1e-9)
    assert perf.intra_sync_s(cfg, 0, "a", members=replicas) == pytest.approx(
        2 * 3 / 4 * g / nvl + nic_s, rel=1e-9
    )
    assert res.closed_breakdown["dp_sync_s"] == pytest.approx(2 * 3 / 4 * g / nvl + nic_s, rel=1e-9)


def _bucket_exposed_by_hand(sync_s: float, window_s: float, n: int) -> float:
    """n equal buckets of a sync of sync_s (each paying its own hop latencies: included in
    sync_s / n by the caller), bucket j ready (j + 1)/n into a backward of window_s,
    reduced one after the other. If a bucket's reduce s fits its slice of the window, all
    but the last bucket hide (exposed s); else the reduces run back to back from the
    first bucket's ready time: exposed n s - (n - 1)/n window."""
    s = sync_s / n
    return s if s <= window_s / n else n * s - (n - 1) / n * window_s


@pytest.mark.parametrize(
    ("micro_batch", "buckets", "case"),
    [(8, 8, "all but the last bucket"), (1, 4, "part"), (1, 0, "none")],
)
def test_overlap_window_hides_all_part_or_none_of_the_sync(
    micro_batch: int, buckets: int, case: str
) -> None:
    """pp 1, tp 8 (a device a node: one NIC ring), 4 replicas at one site, no ZeRO-1: the
    gradient all-reduce in `buckets` buckets under the last micro-batch's backward B
    (--overlap-grad-reduce), each bucket 2 (n-1)/n G/N over the NIC + 2 (n-1) hops.
    Exposed: the hand recurrence above; 0 buckets: the whole all-reduce after B."""
    n = 4
    prob = problem(["a"], [], global_batch=n * micro_batch * 2, overlap=True, zero1=False)
    p = plan(8, [8], [(n, ["a"])], 2)
    p["parallelism"]["micro_batch"] = micro_batch
    res = simulate(prob, p, SimOptions(dp_buckets=buckets))
    perf = PerfModel(prob)
    cfg = _config(prob, p)
    g, nic = perf.stage_grad_bytes(cfg, 0), _nic_Bps(prob, 1)
    window = perf.stage_times(cfg, "h100-sxm")[0].bwd
    exposed = res.step_time_s - res.pipe_s
    whole = 2 * (n - 1) / n * g / nic
    if buckets == 0:
        assert exposed == pytest.approx(whole + 2 * (n - 1) * INTRA_S, rel=1e-9)
        return
    hops = 2 * (n - 1) * INTRA_S
    by_hand = _bucket_exposed_by_hand(whole + buckets * hops, window, buckets)
    assert exposed == pytest.approx(by_hand, rel=1e-9)
    fits = (whole / buckets + hops) <= window / buckets
    assert fits == (case == "all but the last bucket")
    assert 0 < exposed < whole  # the window hides something, and not everything
    # Megatron's own bucketing (max(40M, 1M dp) parameters per GPU: 2 buckets here): the
    # simulation follows the same recurrence; the closed form prices one all-reduce S
    # (one set of hop latencies) as max(S/n, S - (n-1)/n W) (dp_pieces)
    nb = perf.grad_buckets(cfg, 0)
    assert nb == 2
    megatron = simulate(prob, p)
    assert megatron.step_time_s - megatron.pipe_s == pytest.approx(
        _bucket_exposed_by_hand(whole + nb * hops, window, nb), rel=1e-9
    )
    s_all = whole + hops
    assert megatron.closed_breakdown["dp_sync_s"] == pytest.approx(
        max(s_all / nb, s_all - (nb - 1) / nb * window), rel=1e-9
    )


def test_overlapped_sync_of_the_last_rank_hides_under_the_drain() -> None:
    """pp 2, no pipeline site crossing: rank 1's last backward ends a stage backward and
    more before rank 0's, so its bucketed reduce is hidden entirely (sync_end before the
    pipeline ends), while rank 0's is what the step waits for."""
    prob = problem(["a"], [], global_batch=32, overlap=True, zero1=False)
    p = plan(8, [4, 4], [(4, ["a", "a"])], 8)
    p["parallelism"]["micro_batch"] = 4
    res = simulate(prob, p, SimOptions(dp_buckets=8))
    opt = res.breakdown["optimizer_s"]
    assert res.sync_end_s[1] < res.pipe_s - opt
    assert res.step_time_s == pytest.approx(max(res.pipe_s, res.sync_end_s[0] + opt), rel=1e-12)


def test_zero1_param_gather_hides_under_the_first_forward() -> None:
    """ZeRO-1 with --overlap-param-gather: the all-gather half runs under the step's
    first forward (bucket j before its slice), the reduce-scatter half under the last
    backward; without overlap both halves are exposed and add up to the all-reduce."""
    n = 4
    base = dict(global_batch=n * 8 * 2)
    p = plan(8, [8], [(n, ["a"])], 2)
    p["parallelism"]["micro_batch"] = 8
    off = simulate(problem(["a"], [], **base, zero1=True), p)
    ar = simulate(problem(["a"], [], **base, zero1=False), p)
    assert off.step_time_s - off.pipe_s == pytest.approx(ar.step_time_s - ar.pipe_s, rel=1e-9)
    on_prob = problem(["a"], [], **base, zero1=True, overlap=True)
    on = simulate(on_prob, p, SimOptions(dp_buckets=8))
    # the same pipeline (job.overlap also hides TP communication) without a gather
    bare = simulate(problem(["a"], [], **base, zero1=False, overlap=True), p)
    # each half: 8 buckets whose reduce fits their slice (checked), so one bucket of each
    # half is exposed: the gather's first before the first forward, the reduce's last
    half = (off.step_time_s - off.pipe_s) / 2
    hops = (n - 1) * INTRA_S
    per_bucket = (half - hops) / 8 + hops
    window = PerfModel(on_prob).stage_times(_config(on_prob, p), "h100-sxm")[0].fwd
    assert per_bucket <= window / 8
    # (ZeRO-1 also shards the optimizer step: compare the pipelines without it)
    on_pipe = on.pipe_s - on.breakdown["optimizer_s"]
    bare_pipe = bare.pipe_s - bare.breakdown["optimizer_s"]
    assert on_pipe - bare_pipe == pytest.approx(per_bucket, rel=1e-6)
    assert on.step_time_s - on.breakdown["optimizer_s"] - bare_pipe == pytest.approx(
        2 * per_bucket, rel=1e-6
    )


def test_every_bucket_pays_the_wan_latency_in_both() -> None:
    """Overlap on across sites: each of a stage's n buckets is its own collective on the
    data-parallel group's NCCL stream (Megatron-Core start_grad_sync / start_param_sync),
    so each pays its WAN round's latency. pp 1, tp 1, 8 replicas at each of two sites
    1,000 km apart (4.9 ms one way), ZeRO-1: 8 layers of 12 h^2 and untied embedding and
    LM head of v h parameters, 533.7M per GPU, in buckets of 40M: n = 14. Closed form by
    hand: each half (f = 1/2) of the sync S = T_intra + T_wan is exposed max(0, f (S +
    13 lat) - window) per dp_pieces piece, lat = 2 x 4.9 ms (T_wan's two rounds); the
    simulation agrees within 1%, where charging the latency once (before this was priced)
    is more than 40% optimistic."""
    from placer.evaluate import evaluate

    prob = problem(["a", "b"], [("a", "b", 1000.0)], global_batch=16 * 4, overlap=True)
    p = plan(1, [8], [(8, ["a"]), (8, ["b"])], 4, {("a", "b"): 8})
    perf, cfg = PerfModel(prob), _config(prob, p)
    h, v = SMALL_MODEL["hidden"], SMALL_MODEL["vocab"]
    assert math.ceil((8 * 12 * h * h + 2 * v * h) / 40e6) == 14 == perf.grad_buckets(cfg, 0)
    assert perf.dp_lat_repeats(cfg) == (13, 13)
    step = evaluate(prob, p).step
    lat = 2 * 1000 * FIBER_S_PER_KM
    # T_wan: the larger of the busiest route and the NIC term (8 members a site, 1/8 of
    # each site's half of S each way: PerfModel.wan_nic_s), plus the two rounds' latency
    nic_term = perf.wan_nic_s(cfg, 0, {"a": 8, "b": 8})
    assert nic_term == pytest.approx(perf.stage_wan_bytes(cfg, 0) / 8 / _nic_Bps(prob, 1), rel=1e-9)
    assert step.wan_s - max(*step.route_dp_s.values(), nic_term) == pytest.approx(lat, rel=1e-9)
    sync = step.intra_s + step.wan_s
    pieces = perf.dp_pieces(cfg)
    assert [f for f, _ in pieces] == [0.5, 0.5]  # > EXACT_BUCKETS: the continuous windows
    by_hand = sum(max(0.0, f * (sync + 13 * lat) - w) for f, w in pieces)
    assert step.dp_s == pytest.approx(by_hand, rel=1e-9)
    res = simulate(prob, p)
    assert abs(res.rel_diff) <= 0.01
    once = step.pipe_s + sum(max(0.0, f * sync - w) for f, w in pieces)
    assert (once - res.step_time_s) / res.step_time_s < -0.4


@pytest.mark.parametrize(
    "grad, param", [(True, False), (False, True), (False, False)], ids=["grad", "gather", "none"]
)
def test_only_bucketed_halves_repeat_the_latency(grad: bool, param: bool) -> None:
    """The case above with one half of the ZeRO-1 sync overlapped: only a bucketed half
    (the reduce-scatter under --overlap-grad-reduce, the gather under
    --overlap-param-gather) pays the WAN latency once a bucket; the other is one
    collective (after the last backward, or after the optimizer step) paying it once.
    The closed form agrees with the simulation within 2% in each mode."""
    from placer.io import problem_from_data

    base = problem(["a", "b"], [("a", "b", 1000.0)], global_batch=16 * 4, overlap=True)
    data = base.instance.model_dump(mode="json", exclude_none=True)
    data["job"]["overlap"].update(grad_reduce=grad, param_gather=param)
    data["job"]["model"] = base.model.model_dump(mode="json", exclude_none=True)
    prob = problem_from_data(data)
    p = plan(1, [8], [(8, ["a"]), (8, ["b"])], 4, {("a", "b"): 8})
    assert PerfModel(prob).dp_lat_repeats(_config(prob, p)) == (13 * grad, 13 * param)
    assert abs(simulate(prob, p).rel_diff) <= 0.02


def test_interleaved_bubble_is_p_minus_1_over_v() -> None:
    """Uniform stages (tiny vocabulary: no LM-head skew), one site, p 4, m 8: the bubble
    of v chunks per device is (p - 1)/v stage times (Narayanan et al. SC21)."""
    model = {**SMALL_MODEL, "vocab": 8}
    prob = problem(["a"], [], global_batch=8, model=model)
    p = plan(8, [2, 2, 2, 2], [(1, ["a"] * 4)], 8)
    f_b = None
    for v in (1, 2):
        res = simulate(prob, p, SimOptions(virtual_stages=v))
        per_mb = res.breakdown["compute_s"] + res.breakdown["tp_comm_s"]
        f_b = per_mb / 8
        assert res.breakdown["bubble_s"] == pytest.approx(3 / v * f_b, rel=2e-3)
    assert schedule(4, 8, 2, 0)[:4] == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("F", 3, 0)]
    with pytest.raises(InputError):
        schedule(4, 6, 2, 0)


# ----------------------------------------------------------------------------- (d) random plans


@st.composite
def multi_site_plans(draw, overlap: bool = False):
    """2-4 sites on a path (plus a chord), 50-1,000 km, 1-8 waves per route, pp 2 or 4,
    tp 1/2/8, 1-64 replicas in 1-3 groups whose chains visit 1-3 sites in blocks;
    `overlap`: the instance's job.overlap (sync under the backward, ZeRO-1's gather
    under the forward, TP communication hidden)."""
    n = draw(st.integers(2, 4))
    sites = [f"s{i}" for i in range(n)]
    routes = [(sites[i], sites[i + 1], draw(st.floats(50, 1000))) for i in range(n - 1)]
    if n >= 3 and draw(st.booleans()):
        routes.append((sites[0], sites[-1], draw(st.floats(50, 1000))))
    pp = draw(st.sampled_from([2, 4]))
    m = draw(st.sampled_from([pp, 2 * pp]))
    tp = draw(st.sampled_from([1, 2, 8]))
    groups = []
    n_groups = draw(st.integers(1, 3))
    for _ in range(n_groups):
        count = draw(st.integers(1, 64 // n_groups))  # at most 64 replicas in all
        k = draw(st.integers(1, min(pp, n, 3)))
        visit = draw(st.permutations(sites))[:k]
        cuts = sorted(
            draw(st.lists(st.integers(1, pp - 1), min_size=k - 1, max_size=k - 1, unique=True))
        )
        bounds = [0, *cuts, pp]
        chain = [
            s for s, lo, hi in zip(visit, bounds, bounds[1:], strict=False) for _ in range(hi - lo)
        ]
        groups.append((count, chain))
    links = {tuple(sorted(r[:2])): draw(st.integers(1, 8)) for r in routes}
    replicas = sum(c for c, _ in groups)
    prob = problem(sites, routes, global_batch=m * replicas, overlap=overlap)
    return prob, plan(tp, [8 // pp] * pp, groups, m, links)


# the shipped two-campus situation in small: many replicas' boundaries on one wave
_CROWDED = (
    problem(["a", "b"], [("a", "b", 100.0)], global_batch=64 * 4),
    plan(8, [2, 2, 2, 2], [(64, ["a", "a", "b", "b"])], 4, {("a", "b"): 1}),
)

_SETTINGS = settings(
    max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def _contended_bound(prob, p) -> float:
    """An upper bound of the simulated pipeline: every chain's 1F1B time (the closed
    form's own formula) with each cross-site message charged M / min(NIC / 2, C / N) on
    the busiest route of its path. N counts the flows that can be on that route at once:
    the boundary crossings of all replicas, plus the WAN flows of the ranks whose sync
    starts while others still drain (max-min fairness gives every flow at least C / N;
    a device's NIC carries at most its two pipeline sends, or receives, at once)."""
    from collections import Counter

    from placer.perf.pipeline import one_f_one_b_time

    plan_obj = plan_from_data(p)
    cfg, perf = _config(prob, p), PerfModel(prob)
    net = perf.net
    crossings: Counter = Counter()
    for g in plan_obj.replica_groups:
        for a, b in zip(g.stage_sites, g.stage_sites[1:], strict=False):
            for key in net.path(a, b) or []:
                crossings[key] += g.count
    for k in range(cfg.pp):
        hosts: Counter = Counter()
        for g in plan_obj.replica_groups:
            hosts[g.stage_sites[k]] += g.count
        for a in hosts:
            for b in hosts:
                if a != b:
                    for key in net.path(a, b) or []:
                        crossings[key] += max(hosts[a], hosts[b])  # one WAN round's flows a -> b
    waves = {link.key: link.waves for link in plan_obj.links}
    msg = perf.message_bytes(cfg)
    worst = 0.0
    for g in plan_obj.replica_groups:
        chain = g.stage_sites
        st = [perf.stage_times(cfg, "h100-sxm")[k] for k in range(cfg.pp)]
        lat, tx = [], []
        for a, b in zip(chain, chain[1:], strict=False):
            rate = _nic_Bps(prob, cfg.tp) / 2
            for key in net.path(a, b) or []:
                rate = min(rate, net.capacity_Bps(key, waves.get(key, 0)) / crossings[key])
            lat.append(INTRA_S + (net.path_latency_s(a, b) if a != b else 0.0))
            tx.append(msg / rate)
        pipe = one_f_one_b_time(
            [t.fwd for t in st], [t.bwd for t in st], lat, tx, cfg.num_micro_batches
        )
        worst = max(worst, pipe + perf.optimizer_step_s(cfg, tuple(chain)))  # then the optimizer
    return worst


@_SETTINGS
@example(case=_CROWDED)
@given(case=multi_site_plans())
def test_simulated_pipeline_is_bounded_by_its_contended_version(case) -> None:
    """Above the simulated pipeline: the chains re-timed with every route's crossings
    sharing it and each device's NIC carrying two sends at once (_contended_bound); the
    sync of the ranks that finish first shares the routes with the drain too."""
    prob, p = case
    res = simulate(prob, p)
    assert res.pipe_s <= _contended_bound(prob, p) * (1 + 1e-9)
    assert res.step_time_s >= res.pipe_s
    for r in res.routes:
        assert r["peak_utilisation"] <= 1 + 1e-9


@_SETTINGS
@example(case=_CROWDED)
@given(case=multi_site_plans())
def test_closed_form_pipeline_agrees_with_the_simulation(case) -> None:
    """With lockstep contention priced, the closed form's pipeline is within 7% of the
    simulated one on these draws (benchmarks/sim_vs_closed.py, 200 plans without overlap:
    within 2% on 189, worst -9.5% and +11.2%; without contention the closed form was up
    to 38% optimistic; the sync windows are off here, with them the simulated pipeline
    also carries ZeRO-1's exposed parameter gather). The two documented
    differences: the closed form counts every boundary crossing a route as firing at the
    same moment of a tick, exact in the 1F1B steady state and pessimistic in fill and
    drain; in the simulation the stages that finish first start their data-parallel sync
    while the others still drain over the same routes, which the closed form does not see
    (optimistic). A single chain type over one route, the README's case, agrees to
    rounding (test_replicas_share_the_route_at_every_tick)."""
    prob, p = case
    res = simulate(prob, p)
    assert res.closed_pipe_s == pytest.approx(res.pipe_s, rel=0.07)


@st.composite
def one_site_full_node_plans(draw):
    """Every stage's replicas at one site, in whole nodes or not (any replica count up
    to 64: a part-filled node is priced by node_fill), overlap on or off, ZeRO-1 or not:
    where the simulator and the closed form model the same collective."""
    tp = draw(st.sampled_from([1, 2, 8]))
    pp = draw(st.sampled_from([1, 2, 4]))
    m = draw(st.sampled_from([pp, 2 * pp]))
    replicas = draw(st.integers(2, 64))
    overlap, zero1 = draw(st.booleans()), draw(st.booleans())
    prob = problem(["a"], [], global_batch=m * replicas, overlap=overlap, zero1=zero1)
    return prob, plan(tp, [8 // pp] * pp, [(replicas, ["a"] * pp)], m)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(case=one_site_full_node_plans())
def test_step_agrees_within_2_percent_when_each_stage_syncs_inside_one_site(
    case,
) -> None:
    """The 2% of issue 11 where the two model the same thing: each stage's sync inside
    one site (NVLink inside, one NIC ring per node shard, a part-filled node's members
    carrying its missing shards), with or without the overlap windows. Without overlap
    the two agree to 0.01%. Across sites the closed form differs by construction
    (placer.sim.job's docstring; the tables in benchmarks/README.md). With more than
    EXACT_BUCKETS buckets the closed form prices the continuous window, optimistic by at
    most the last bucket of each half: sync / n (dp_pieces); and it charges the ring's
    hop latencies once, where each of the n buckets pays them: (n - 1) 2 (N - 1) hops
    for N nodes."""
    from placer.evaluate import evaluate
    from placer.perf.step import EXACT_BUCKETS

    prob, p = case
    res = simulate(prob, p)
    perf, cfg = PerfModel(prob), _config(prob, p)
    n = min(perf.grad_buckets(cfg, k) for k in range(cfg.pp))
    residual = 0.0
    if prob.instance.job.overlap.grad_reduce and cfg.dp >= 2:
        step = evaluate(prob, p).step
        nodes = math.ceil(cfg.dp / max(1, 8 // cfg.tp))
        residual = (n - 1) * 2 * (nodes - 1) * INTRA_S / res.step_time_s
        if n > EXACT_BUCKETS:
            residual += (step.intra_s + step.wan_s) / n / res.step_time_s
    if not prob.instance.job.overlap.grad_reduce:  # the ranks' syncs spread over the drain
        assert res.step_time_s == pytest.approx(res.closed_form_s, rel=1e-4)
    assert -0.02 - residual <= res.rel_diff <= 0.02


# ----------------------------------------------------------------------------- CLI


def test_cli_simulate_json_is_one_document(tmp_path) -> None:
    prob_data = {
        "name": "cli-sim",
        "sites": [
            {"name": "a", "gpu": "h100-sxm", "gpus": 512},
            {"name": "b", "gpu": "h100-sxm", "gpus": 512},
        ],
        "routes": [{"sites": ["a", "b"], "km": 100, "fiber_pairs": 2}],
        "job": {"model": SMALL_MODEL, "global_batch": 16},
    }
    (tmp_path / "i.json").write_text(json.dumps(prob_data))
    (tmp_path / "p.json").write_text(
        json.dumps(plan(8, [4, 4], [(4, ["a", "b"])], 4, {("a", "b"): 1}))
    )
    r = CliRunner().invoke(
        app, ["simulate", str(tmp_path / "i.json"), str(tmp_path / "p.json"), "--json"]
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["replicas"] == 4 and doc["step_time_s"] > doc["closed_form"]["pipe_s"] > 0
    assert set(doc["breakdown"]) == {
        "compute_s",
        "tp_comm_s",
        "bubble_s",
        "pp_comm_s",
        "dp_sync_s",
        "optimizer_s",
    }
    assert sum(doc["breakdown"].values()) == pytest.approx(doc["step_time_s"], rel=1e-9)
    human = CliRunner().invoke(
        app, ["simulate", str(tmp_path / "i.json"), str(tmp_path / "p.json")]
    )
    assert human.exit_code == 0 and "closed form" in human.stdout
    # a plan whose route has no capacity cannot be simulated: exit 2, no traceback
    (tmp_path / "bad.json").write_text(json.dumps(plan(8, [4, 4], [(4, ["a", "b"])], 4)))
    bad = CliRunner().invoke(
        app, ["simulate", str(tmp_path / "i.json"), str(tmp_path / "bad.json")]
    )
    assert bad.exit_code == 2 and "no capacity" in bad.output
    opt = CliRunner().invoke(
        app, ["simulate", str(tmp_path / "i.json"), str(tmp_path / "p.json"), "--dp-buckets", "-1"]
    )
    assert opt.exit_code == 2 and "dp_buckets" in opt.output


def test_plan_routing_splits_each_message_over_its_paths() -> None:
    """A pipeline pair a-c split half direct, half via b: each route of both paths
    carries half of every message, each way (R m M / 2 bytes per direction)."""
    r_count, m = 4, 4
    prob = problem(
        ["a", "b", "c"],
        [("a", "b", 100.0), ("b", "c", 100.0), ("a", "c", 150.0)],
        global_batch=r_count * m,
    )
    p = plan(8, [4, 4], [(r_count, ["a", "c"])], m, {("a", "b"): 1, ("b", "c"): 1, ("a", "c"): 1})
    p["routing"] = [
        {
            "phase": "pipeline",
            "sites": ["a", "c"],
            "paths": [{"via": ["a", "c"], "share": 0.5}, {"via": ["a", "b", "c"], "share": 0.5}],
        }
    ]
    res = simulate(prob, p)
    msg = SMALL_MODEL["seq_len"] * SMALL_MODEL["hidden"] * 2
    carried = {tuple(r["route"]): r["bytes"] for r in res.routes}
    for key in [("a", "c"), ("c", "a"), ("a", "b"), ("b", "a"), ("b", "c"), ("c", "b")]:
        assert carried[key] == pytest.approx(r_count * m * msg / 2, rel=1e-9)
    # both halves move at the same rate (R flows on one wave either way) and finish
    # together; the message arrives when the slower half does, over the 200 km via b
    slow = INTRA_S + 200.0 * FIBER_S_PER_KM
    for t in res.transfers:
        if t.cross_site:
            assert t.arrival - t.sent == pytest.approx(slow, rel=1e-9)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(p=st.integers(1, 6), groups=st.integers(1, 3), v=st.integers(1, 4))
def test_schedule_runs_every_op_once_in_dependency_order(p: int, groups: int, v: int) -> None:
    """Each rank runs F and B of each of its chunks for every micro-batch exactly once,
    and the schedule of all ranks together can be executed (no rank waits forever)."""
    m = groups * p
    orders = [schedule(p, m, v, r) for r in range(p)]
    for r, ops in enumerate(orders):
        assert sorted(ops) == sorted(
            (kind, x, c * p + r) for kind in "FB" for x in range(m) for c in range(v)
        )
    done: set = set()
    pos = [0] * p
    n_stages = p * v
    while any(pos[r] < len(orders[r]) for r in range(p)):
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                kind, x, s = orders[r][pos[r]]
                need = (
                    ("F", x, s - 1)
                    if kind == "F"
                    else ("B", x, s + 1)
                    if s < n_stages - 1
                    else ("F", x, s)
                )
                if kind == "F" and s == 0 or need in done:
                    done.add((kind, x, s))
                    pos[r] += 1
                    moved = True
                else:
                    break
        assert moved, "deadlock"


def test_interleaving_crosses_the_wan_at_every_chunk_boundary_and_the_wrap() -> None:
    """pp 2 split over two sites, v 2: model stages a|b|a|b, so each micro-batch crosses
    the WAN three times each way (0->1, the wrap 1->2, 2->3), v = 1 only once."""
    r_count, m = 2, 4
    prob = problem(["a", "b"], [("a", "b", 100.0)], global_batch=r_count * m)
    p = plan(8, [4, 4], [(r_count, ["a", "b"])], m, {("a", "b"): 1})
    for v, crossings in ((1, 1), (2, 3)):
        res = simulate(prob, p, SimOptions(virtual_stages=v))
        assert sum(t.cross_site for t in res.transfers) == 2 * crossings * r_count * m


# (closed form - simulation) / simulation of the whole step on random multi-site plans, by
# how each stage's data-parallel sync runs (sim_cases.dp_sync_class, the split of the
# "data-parallel sync of each stage" tables in benchmarks/README.md) and job.overlap: the
# envelope measured by benchmarks/sim_vs_closed.py --random-only (200 plans seed 1, 1,000
# plans seed 2), over 400 draws of multi_site_plans and, below (branch series), over
# 2,000 fresh draws of it (benchmarks/step_bounds_draws.py --seed 0..4), rounded out to
# the next 0.5-1%. The fresh draws widened only lower bounds, and on each class's lowest
# draw the closed T_pipe is below the simulated one (the sync is not): a hop direction
# carries one boundary's activations and another's gradients, which the lockstep tick
# (PerfModel.route_tick_s) prices at different moments of the tick; where one batch of
# them takes longer than the stage tick (2.33 ms against 0.5 + 1.1 ms on the worst
# draw, 25 replicas over one wave) they share the hop in the simulation (closed T_pipe
# 81 ms against the simulated 110; benchmarks/README.md, branch series).
# A change that widens the gap on these draws fails here; one that narrows it should
# tighten the bound (re-measure with the commands in benchmarks/README.md).
STEP_BOUNDS: dict[tuple[str, bool], tuple[float, float]] = {
    # the same hierarchical collective in both (agree to rounding: test_step_agrees_...);
    # what is left is T_pipe: the ranks that finish first sync over the drain (<= 0) and
    # the fill / drain crossings counted at one moment (>= 0); measured -5.6% / +0.0%
    # branch hops (a chain's boundaries sharing a route direction share its FIFO,
    # PerfModel.boundary_queues): lows -7.4% -> -2.4%; seed 2 plan 412 -0.5% -> +3.6%
    ("inside one site, full nodes", False): (-0.03, 0.04),  # fresh draws: -2.4%
    # as above, with a T_pipe outlier where the per-tick transfer exceeds a stage tick
    # and the early ranks' NIC rings share the routes' NICs; measured -13.6% / +0.0%
    # branch hops: seed 2 plan 839 -13.6% -> -2.6%; fresh draws -7.5% -> -5.9%
    ("inside one site, a part-filled node", False): (-0.065, 0.005),
    # the WAN phase: each stage's exchange from its backward's end, released at a lower
    # bound of its real stagger in at most 4 groups (PerfModel.dp_release_s; before it
    # charged every rank's at once: median +6-7%, now +4-5%), each group's longest NIC
    # phase in series with its WAN work (PerfModel.step; before, the slowest stage's
    # after T_pipe: it moved no whole-node plan), and with q = 1 the NIC ring ceil(d / q)
    # of all replicas, not the site's own (all pessimistic); optimistic only by T_pipe;
    # measured -4.8% / +33.5% (branch glat: each release group's own WAN latency; before
    # -4.8% / +37.4%, before the stagger -6.9% / +37.4%); branch moments, each release
    # group credited the plan's own drain (PerfModel.dp_moments_s: a crossing drain's
    # fiber latency, a shorter chain's slack): -5.3% / +22.9% over seed 1, seed 2's
    # 1,000 and 400 draws (the sync now overlaps the drain's messages on its route
    # earlier, which the closed form does not charge: optimistic by that much); branch
    # nic (the WAN phase's NIC term, 0 where q = 1): -5.3% / +22.7%
    # branch hops: fresh draws' low -10.6% -> -7.4% (two chain types crossing one route
    # in opposite directions: not a chain's own shared FIFO)
    # each release group's routes with a flow-routed pair (PerfModel.step: its stages' own
    # routes at its group's load, where every stage's load was charged in every group):
    # seed 2 +22.7% -> +21.4%, its low -5.5% -> -8.0% (plan 199: the closed T_pipe 9.5%
    # below the simulated one, two chain types crossing routes in opposite directions,
    # which the sync's pessimism had masked; its sync is still above the simulation's)
    ("across sites, full nodes", False): (-0.09, 0.24),  # fresh draws: -7.4%
    # as above; the WAN phase's NIC term (PerfModel.wan_nic_s, branch nic) charges a site
    # hosting few members of a stage for sending its shard through their NICs, which was
    # the optimistic tail (plan 358 of seed 2: -17.1% -> +0.1%); what is left below is an
    # early stage's sync overlapping the drain's messages on its route, above the
    # stagger's lower-bound credit, now with a slow site's NIC term in series (seed 2
    # plan 919: -2.8% -> +16.1%); measured -4.7% / +22.2% (before: branch glat -15.7% /
    # +24.0%; ovl4 -15.7% / +30.9%; before the stagger -14.7% / +46.3%; moments -17.1% /
    # +19.2%); branch series (each stage's own NIC phase, latency and NIC term in series,
    # PerfModel.step): unchanged here, fresh draws' max +25.4% -> +18.0%
    # branch hops: fresh draws' low -9.1% -> -4.6%
    # branch stage-routes: a run while this file was being edited drew other examples,
    # one at +23.01% (_ring_part_filled; the same on main, where every stage's routes
    # were already its own busiest), so the high is 23.5%, that draw an @example below
    ("across sites, a part-filled node", False): (-0.055, 0.235),  # fresh draws: -4.6%
    # overlap on: the bucketed sync under the last backward; the closed form charges the
    # ring's hop latencies once where every bucket pays them and the continuous window
    # above EXACT_BUCKETS buckets (optimistic), plus T_pipe; measured -6.1% / +3.9%
    # branch hops: lows -7.1% -> -4.2%; seed 2 plan 412 -0.6% -> +4.0%
    ("inside one site, full nodes", True): (-0.05, 0.045),  # fresh draws: -4.2%
    # measured -14.0% / +2.1%
    # branch hops: seed 2 plan 839 -14.0% -> -2.7%; lowest now -6.6% (seed 2)
    ("inside one site, a part-filled node", True): (-0.07, 0.025),
    # every bucket pays the WAN latency in both (PerfModel.dp_lat_repeats; before, the
    # closed form charged it once: -52.4%); the WAN phase as above (staggered but for
    # ZeRO-1's parameter gather, which every rank starts with the step), the most buckets
    # of any rank at the slowest stage's latency (pessimistic), against the simulated
    # ZeRO-1 gather delaying the first forward (optimistic; each rank's gather exposed
    # past a lower bound of its first forward, PerfModel.dp_fill_s); measured -7.2% /
    # +64.7% (branch gather; branch glat -7.2% / +65.6%; before -7.2% / +67.5%); branch
    # moments, the plan's own drain and fill (a crossing fill exposes the later ranks'
    # gathers a one-way latency later): -11.2% / +39.1%; branch nic: -11.4% / +39.1%
    # branch hops: fresh draws' low -12.4% -> -10.0%; seed 2's -11.4% unchanged
    # branch credit (each ZeRO-1 half's whole head start, PerfModel.dp_credit_scale, and
    # the gathers sharing every stage's bytes on their routes): max +39.4% -> +26.5%
    # (seed 1), lows seed 2 -11.4% -> -8.3%, fresh draws -10.0% -> -10.7% (the T_pipe
    # draw of two chain types crossing one route in opposite directions)
    # branch repeats2 (each release group its own stages' latency repeats, R_k lat_k,
    # PerfModel.dp_stage_repeats, where every bucketed piece paid the most buckets of any
    # rank at the slowest pair's latency): max +26.5% -> +12.7% (seed 1), seed 2 +22.8%
    # and fresh draws +21.1% unchanged (not the repeats), lows unchanged
    # branch own-series (as below): max seed 1 +12.7% -> +10.3%, seed 2 +22.8% and fresh
    # draws +21.1% unchanged, lows unchanged
    ("across sites, full nodes", True): (-0.12, 0.24),  # fresh draws: -10.7%
    # as above, with the WAN phase's NIC term (branch nic; before it the missing term was
    # optimistic, -12.0% / +43.5% on branch moments; -12.0% / +50.4% on branch gather;
    # before the per-bucket latency: -59.7% / +26.9%); measured -5.3% / +42.5%
    # branch hops: fresh draws' low -8.5% -> -4.9%; seed 1 -5.3%
    # branch credit (as above): max +42.5% -> +40.9% (seed 2: the bucket latency at the
    # slowest pair's, in series with the group's longest NIC phase), lows -5.3% -> -3.9%
    # branch repeats2 (as above): max seed 1 +26.9% -> +16.1%, seed 2 +40.9% -> +27.7%,
    # fresh draws +30.5% -> +17.9%; fresh draws' low -3.9% -> -5.1% (the change only
    # lowers the closed form; that draw's cause not examined)
    # branch own-series (each release group's work per stage: a stage's NIC phase,
    # latency and repeats with the routes, the longest NIC phase with the routes alone,
    # PerfModel.step, where the longest NIC phase, the slowest pair's latency and the
    # largest repeats came from up to three stages): max seed 2 +27.7% -> +17.9%, seed 1
    # +16.1% -> +12.1%, fresh draws +17.9% -> +15.8%; fresh draws' low -5.1% -> -10.1%:
    # seed 2 draw 387 (a ring of four sites, stage 0's 45 replicas inside s2), whose
    # simulated T_pipe is 16% longer than the closed form's (the overlapped syncs share
    # the NICs and routes with the pipeline's messages, which the closed form does not
    # charge), which the over-charged sync had hidden (main -2.8%)
    ("across sites, a part-filled node", True): (-0.11, 0.19),  # fresh draws: -10.1%
}


# sim_vs_closed.py --random 1000 --seed 2 --overlap on, plans 53 and 62:
# (routes, pp 2, m 2, tp 1, replica groups, waves)
OWN_SERIES_CASES = {
    "two-sites": (
        [("s0", "s1", 337.845610967221)],
        [(14, ["s1", "s0"]), (11, ["s1", "s1"])],
        {("s0", "s1"): 6},
    ),
    "triangle": (
        [
            ("s0", "s1", 929.2284203511691),
            ("s1", "s2", 670.4915835130047),
            ("s0", "s2", 225.5361001988978),
        ],
        [(21, ["s0", "s1"]), (17, ["s2", "s0"]), (20, ["s0", "s0"])],
        {("s0", "s1"): 2, ("s1", "s2"): 6, ("s0", "s2"): 3},
    ),
}


@pytest.mark.parametrize("case", sorted(OWN_SERIES_CASES))
def test_each_stage_pays_its_own_series_against_the_simulation(case: str) -> None:
    """sim_vs_closed.py seed 2 plans 53 and 62 (job.overlap on, ZeRO-1, pp 2, tp 1). On
    two sites stage 0's 25 replicas sync inside s1 (4 nodes: the longest NIC phase, 20 ms)
    and stage 1 splits 11 / 14 over 338 km (7 buckets: R_1 = 6); on the triangle both
    stages split, stage 0 over s0 - s2 (226 km) with the longer NIC phase, stage 1 over
    s0 - s1, whose sync may take the detour through s2 (a flow-routed pair). Each stage's
    NIC phase, WAN rounds and latency repeats run on its own ranks, one after the other
    (placer.sim), so each release group's work takes them from one stage
    (PerfModel.step): the closed form is within 2% of the simulation, where the group's
    longest NIC phase in series with the slowest pair's latency and the largest repeats,
    taken from different stages (before), was +27.7% and +24.7%."""
    routes, groups, links = OWN_SERIES_CASES[case]
    sites = sorted({s for r in routes for s in r[:2]})
    prob = problem(sites, routes, global_batch=2 * sum(c for c, _ in groups), overlap=True)
    p = plan(1, [4, 4], groups, 2, links)
    perf = PerfModel(prob)
    cfg = config_of(prob, plan_from_data(p))
    assert perf.any_dp_pair_routed() == (case == "triangle")
    assert perf.dp_stage_repeats(cfg)[1] >= 4 and cfg.zero1
    res = simulate(prob, p)
    assert abs(res.rel_diff) < 0.02


def test_each_stage_pays_its_own_latency_repeats_against_the_simulation(monkeypatch) -> None:
    """sim_vs_closed.py seed 1 plan 29 (job.overlap on): pp 4 over a chain of four sites,
    22 replicas s3 s3 s1 s2 and one s3 s0 s1 s1. Stage 0 syncs inside s3; stage 1 over
    s0 - s3 (1,685 km, 3 buckets: R_1 = 2), stage 3 over s1 - s2 (815 km, 5 buckets:
    R_3 = 4). Every bucket of a stage pays its own pairs' latency again, one after the
    other on its ranks (placer.sim), so each release group carries the largest R_k lat_k
    of its stages (PerfModel.dp_stage_repeats): the closed form is within 0.5% of the
    simulation, where every bucketed piece paying the most buckets of any rank (4) at the
    slowest pair's latency (1,685 km; before) was +26.9%."""
    prob = problem(
        ["s0", "s1", "s2", "s3"],
        [
            ("s0", "s1", 405.0409029718441),
            ("s1", "s2", 815.2049507624572),
            ("s2", "s3", 465.3107239148084),
        ],
        global_batch=4 * 23,
        overlap=True,
    )
    p = plan(
        1,
        [2, 2, 2, 2],
        [(22, ["s3", "s3", "s1", "s2"]), (1, ["s3", "s0", "s1", "s1"])],
        4,
        {("s0", "s1"): 5, ("s1", "s2"): 4, ("s2", "s3"): 8},
    )
    perf = PerfModel(prob)
    cfg = config_of(prob, plan_from_data(p))
    assert perf.dp_stage_repeats(cfg) == (4, 2, 2, 4)
    res = simulate(prob, p)
    assert abs(res.rel_diff) < 0.005
    with monkeypatch.context() as m:  # the repeats as charged before
        m.setattr(PerfModel, "dp_stage_repeats", lambda self, cfg: (0,) * cfg.pp)
        m.setattr(PerfModel, "dp_repeat_share", lambda self, cfg: (0.0, 0.0))
        old = PerfModel(prob)
        groups = [
            (c, tuple(ch))
            for c, ch in ((22, ("s3", "s3", "s1", "s2")), (1, ("s3", "s0", "s1", "s1")))
        ]
        waves = {("s0", "s1"): 5, ("s1", "s2"): 4, ("s2", "s3"): 8}
        st = old.step(cfg, groups, waves)
        lat = 2 * old.net.path_latency_s("s0", "s3")
        pieces = zip(
            old.dp_pieces(cfg), old.dp_lat_repeats(cfg), old.dp_staggered(cfg), strict=True
        )
        before = st.pipe_s + sum(
            max(0.0, f * ((st.sync_staggered_s if stag else st.gather_staggered_s) + r * lat) - w)
            for (f, w), r, stag in pieces
        )
    assert (before - res.step_time_s) / res.step_time_s > 0.25


def test_each_stage_pays_its_own_routes_against_the_simulation() -> None:
    """sim_vs_closed.py seed 2 plan 155 (job.overlap on, ZeRO-1, tp 8 pp 4, full nodes): a
    ring of four sites, 4 replicas s0 s0 s3 s3, 6 s2 s0 s0 s0 and 5 s0 s0 s0 s0. Stage 0
    syncs over s0 - s2, a flow-routed pair (no route between them: over s1 on 8 waves or
    over s3, whose s0 - s3 route has 1 wave), stages 2 and 3 over s0 - s3. Each stage's
    WAN rounds use its own pairs' paths (placer.sim), so its route term is the busiest
    route of those, at every stage's load, or the NIC term (PerfModel.step, stage_bw):
    the closed form is within 2% of the simulation, where charging stage 0 the whole WAN
    phase's busiest route (s0 - s3 at 1 wave, before) was +22.8%."""
    prob = problem(
        ["s0", "s1", "s2", "s3"],
        [
            ("s0", "s1", 265.62916501337395),
            ("s1", "s2", 418.99230235346704),
            ("s2", "s3", 919.9537079216909),
            ("s0", "s3", 516.5517642006043),
        ],
        global_batch=4 * 15,
        overlap=True,
    )
    groups = [(4, ["s0", "s0", "s3", "s3"]), (6, ["s2", "s0", "s0", "s0"]), (5, ["s0"] * 4)]
    waves = {("s0", "s1"): 8, ("s1", "s2"): 8, ("s2", "s3"): 3, ("s0", "s3"): 1}
    p = plan(8, [2, 2, 2, 2], groups, 4, waves)
    perf = PerfModel(prob)
    cfg = config_of(prob, plan_from_data(p))
    assert perf.any_dp_pair_routed() and cfg.zero1
    st = perf.step(cfg, [(c, tuple(ch)) for c, ch in groups], waves)
    # the s0 - s3 route, which stage 0's flow does not use, is the WAN phase's busiest
    busiest = max(st.route_dp_s, key=st.route_dp_s.get)
    assert busiest == ("s0", "s3")
    res = simulate(prob, p)
    assert abs(res.rel_diff) < 0.02


def test_each_stage_pays_its_own_nic_term_against_the_simulation() -> None:
    """sim_vs_closed.py seed 2 plan 786 (no overlap, tp 1 pp 2): a triangle (every pair
    flow-routed), 1 replica s0 s2, 15 s0 s1 and 5 s1 s1. Stage 1's one member at s2 sends
    its site's whole shard through its one NIC (its WAN NIC term, ~11.9 ms); stage 0's
    members (16 at s0, 5 at s1) have their own NICs, ~2.4 ms. Each stage's WAN rounds run
    on its own ranks (placer.sim), so stage 0's series is its NIC phase, its two one-way
    latencies and its own NIC term (or its routes): the closed form's sync is stage 0's
    series to 0.1 ms and the step within 2% of the simulation, where charging stage 0
    every stage's NIC term (before) was +22%."""
    prob = problem(
        ["s0", "s1", "s2"],
        [
            ("s0", "s1", 912.7929951958832),
            ("s1", "s2", 167.69916239552666),
            ("s0", "s2", 473.10596174506185),
        ],
        global_batch=2 * 21,
    )
    groups = [(1, ["s0", "s2"]), (15, ["s0", "s1"]), (5, ["s1", "s1"])]
    waves = {("s0", "s1"): 1, ("s1", "s2"): 8, ("s0", "s2"): 4}
    p = plan(1, [4, 4], groups, 2, waves)
    perf = PerfModel(prob)
    cfg = config_of(prob, plan_from_data(p))
    assert perf.any_dp_pair_routed()
    st = perf.step(cfg, [(c, tuple(ch)) for c, ch in groups], waves)
    hosts = [{"s0": 16, "s1": 5}, {"s2": 1, "s1": 20}]
    nic = [perf.wan_nic_s(cfg, k, hosts[k]) for k in range(2)]
    assert nic[1] > 4 * nic[0]  # the lone member's NIC carries its site's shard
    # stage 0's series: its NIC phase, two one-way latencies of its path (s0 - s2 - s1,
    # the shortest), its own NIC term (above its routes' time)
    intra0 = max(perf.intra_sync_s(cfg, 0, s, members=n) for s, n in hosts[0].items())
    lat0 = 2 * perf.net.pair_latency_s(None, "data_parallel", "s0", "s1")
    assert max(st.route_dp_s.values()) < nic[0]
    series0 = intra0 + lat0 + nic[0]
    assert st.dp_s == pytest.approx(series0, abs=1e-4)
    res = simulate(prob, p)
    assert abs(res.rel_diff) < 0.02
    assert res.step_time_s - res.pipe_s == pytest.approx(series0, rel=0.02)


def test_each_release_group_loads_its_routes_with_its_own_stages_against_the_simulation() -> None:
    """sim_vs_closed.py seed 2 plan 209 (no overlap, tp 2 pp 2): a ring of four sites (every
    pair flow-routed), 18 replicas inside s1 and 24 inside s3, so both stages sync over
    s1 - s0 - s3, whose s0 - s1 route (2 waves) is the busiest. Stage 1's last backward
    ends first and its sync starts T_end - release_1 before stage 0's (dp_moments_s), so
    the route carries stage 0's bytes alone at the end: the sync is the NIC phase and the
    pair's two one-way latencies in series with the larger of stage 0's bytes over the
    route and both stages' bytes less that head start. Before, every release group's
    stages paid every stage's bytes on their routes: +11.0% against the simulation, now
    +1.5%."""
    prob = problem(
        ["s0", "s1", "s2", "s3"],
        [("s0", "s1", 297.0), ("s1", "s2", 383.0), ("s2", "s3", 429.0), ("s0", "s3", 206.0)],
        global_batch=2 * 42,
    )
    groups = [(18, ["s1", "s1"]), (24, ["s3", "s3"])]
    waves = {("s0", "s1"): 2, ("s1", "s2"): 2, ("s2", "s3"): 6, ("s0", "s3"): 4}
    p = plan(2, [4, 4], groups, 2, waves)
    perf = PerfModel(prob)
    cfg = config_of(prob, plan_from_data(p))
    assert perf.any_dp_pair_routed()
    chains = [(c, tuple(ch)) for c, ch in groups]
    st = perf.step(cfg, chains, waves)
    hosts = {"s1": 18, "s3": 24}
    intra = max(perf.intra_sync_s(cfg, k, s, members=n) for k in range(2) for s, n in hosts.items())
    lat = 2 * perf.net.pair_latency_s(None, "data_parallel", "s1", "s3")
    # each stage's ring over two sites: 2 S_k / 2 bytes each way on every route of the path
    cap = perf.net.capacity_Bps(("s0", "s1"), 2)
    alone, both = (sum(perf.stage_wan_bytes(cfg, k) for k in ks) / cap for ks in ([0], [0, 1]))
    release, _fill, t_end = perf.dp_moments_s(cfg, [ch for _, ch in chains])
    head_start = t_end - release[1]
    assert head_start > 0 and both - head_start > alone  # the second group decides here
    assert st.dp_s == pytest.approx(intra + lat + max(alone, both - head_start), rel=1e-6)
    res = simulate(prob, p)
    assert abs(res.rel_diff) < 0.02
    # every stage's bytes in every group (before) is > 2% above the simulation
    assert (st.step_time_s + head_start) / res.step_time_s - 1 > 0.02


def _across_sites_full_nodes(overlap: bool):
    """Every stage hosted by both sites in whole nodes (tp 8: a replica a node): the
    WAN phase of every stage's sync, the case the random draws reach least."""
    prob = problem(["a", "b"], [("a", "b", 300.0)], global_batch=4 * 32, overlap=overlap)
    return prob, plan(
        8,
        [2, 2, 2, 2],
        [(16, ["a", "a", "b", "b"]), (16, ["b", "b", "a", "a"])],
        4,
        {("a", "b"): 2},
    )


def _ring_part_filled():
    """A ring of four sites on one wave each, tp 1 pp 4 (a part-filled node), overlap off:
    21 replicas s2 s0 s0 s0, one s2 s3 s1 s1, one inside s2. The closed form is +23.0%
    above the simulation, the highest of this class's draws (STEP_BOUNDS)."""
    prob = problem(
        ["s0", "s1", "s2", "s3"],
        [("s0", "s1", 227.0), ("s1", "s2", 141.0), ("s2", "s3", 191.0), ("s0", "s3", 50.0)],
        global_batch=4 * 23,
        overlap=False,
    )
    groups = [(1, ["s2", "s3", "s1", "s1"]), (1, ["s2"] * 4), (21, ["s2", "s0", "s0", "s0"])]
    waves = {("s0", "s1"): 1, ("s1", "s2"): 1, ("s2", "s3"): 1, ("s0", "s3"): 1}
    return prob, plan(1, [2, 2, 2, 2], groups, 4, waves)


@settings(
    max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@example(case=_across_sites_full_nodes(False))
@example(case=_across_sites_full_nodes(True))
@example(case=_ring_part_filled())
@given(case=st.booleans().flatmap(lambda overlap: multi_site_plans(overlap=overlap)))
def test_closed_form_step_is_within_the_measured_bounds_of_the_simulation(case) -> None:
    """Issue 11 item 5's "difference documented and bounded by a test": the whole step
    (pipeline, data-parallel sync, optimizer) on random multi-site plans (2-4 sites,
    50-1,000 km, 1-8 waves, up to 64 replicas), overlap off and on, within the bounds
    measured per sync case (STEP_BOUNDS, each with its reason). Where each stage syncs
    inside one site the two agree to 2% up to the T_pipe residual; across sites the WAN
    phase differs by construction (placer.sim.job's docstring; benchmarks/README.md)."""
    prob, p = case
    res = simulate(prob, p)
    overlap = prob.instance.job.overlap.grad_reduce
    lo, hi = STEP_BOUNDS[(dp_sync_class(prob, p), overlap)]
    assert lo <= res.rel_diff <= hi
