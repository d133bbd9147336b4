"""Tests of the 1F1B pipeline model: closed form vs discrete-event simulator vs hand values."""

from __future__ import annotations

import math
import random
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.perf import pipeline
from placer.perf.pipeline import (
    bubble_fraction,
    one_f_one_b_order,
    one_f_one_b_time,
    simulate_1f1b,
    steady_state_period,
)

# ---------------------------------------------------------------------------------------------
# Reference: the pure-Python O(p m) closed form that one_f_one_b_time replaced (same recursion,
# one stage at a time).  The vectorized implementation must agree with it to 1e-12 relative.


def _reference_one_f_one_b_time(fwd, bwd, latency, transmit, m: int) -> float:
    """The original pure-Python ``one_f_one_b_time`` (commit a8d0a11), kept verbatim as the
    reference for the vectorized implementation."""
    f, b, lat, tx = ([float(x) for x in v] for v in (fwd, bwd, latency, transmit))
    p = len(f)
    d = [tx[j] + lat[j] for j in range(p - 1)]
    neg = -math.inf
    s0 = max(0, p - m)  # stages below s0 have no steady pairs (m < p)

    # Warm-up lattice W(k) (includes the entry forward) and cool-down lattice C(k) (excludes the
    # exit backward): one op per row crossed, crossing delays, and p-1-k right moves on the
    # heaviest row (stage or FIFO) crossed.
    warm = [neg] * p
    cool = [neg] * p
    sf = sb = sd = 0.0
    for k in range(p):
        sf += f[k]
        if k >= s0:
            warm[k] = sf + sd + (p - 1 - k) * max(f[: k + 1] + tx[:k])
            cool[k] = sb + sd + (p - 1 - k) * max(b[: k + 1] + tx[:k])
        sb += b[k]
        if k < p - 1:
            sd += d[k]

    # Steady-state zigzag, one slot at a time (slot t = steady pair index + 1):
    #   fwd_done[s]  best path ending with a forward on stage s in this slot,
    #   fwd_q[s]     same, the activation possibly queued behind later ones on link s,
    #   bwd_q[s]     best path ending with a backward on stage s in this slot, possibly followed
    #                by queued gradients on link s-1,
    #   entry[s]     warm-up path entering stage s, possibly through the queue of link s-1.
    entry = warm[:]
    fwd_q = [neg] * p
    bwd_q = [neg] * p
    best = neg
    for t in range(1, m + 1):
        if t > 1:
            entry = [neg] + [entry[s] + tx[s - 1] for s in range(1, p)]
        fwd_done = [neg] * p
        for s in range(s0, p):
            v = max(entry[s], bwd_q[s] + f[s])  # entry, or turn after last slot's backward
            if s > s0:
                v = max(v, fwd_q[s - 1] + d[s - 1] + f[s])  # down from stage s-1
            fwd_done[s] = v
        for s in range(s0, p - 1):
            fwd_q[s] = max(fwd_done[s], fwd_q[s] + tx[s])
        up = neg  # backward run climbing from deeper stages
        for s in range(p - 1, s0 - 1, -1):
            bwd = max(fwd_done[s], up) + b[s]
            if s > 0:
                bwd_q[s] = max(bwd, bwd_q[s] + tx[s - 1])
                up = bwd_q[s] + d[s - 1]
            else:
                bwd_q[s] = bwd
        k_out = t - (m - p + 1)  # the stage whose last steady backward falls in this slot
        if s0 <= k_out < p:
            best = max(best, bwd_q[k_out] + cool[k_out])
    return best


# ---------------------------------------------------------------------------------------------
# Hand values


@pytest.mark.parametrize(
    ("p", "m", "f", "b"),
    [
        (1, 1, 1.0, 2.0),
        (2, 2, 1.0, 2.0),
        (4, 8, 0.010, 0.020),
        (8, 8, 3.0, 5.0),
        (16, 64, 0.005, 0.011),
        (3, 1, 1.0, 2.0),  # m < p
        (8, 3, 1.0, 2.0),  # m < p
    ],
)
def test_uniform_no_comm_is_m_plus_p_minus_1_times_f_plus_b(p, m, f, b):
    expected = (m + p - 1) * (f + b)  # Megatron's hand formula
    args = ([f] * p, [b] * p, [0.0] * (p - 1), [0.0] * (p - 1), m)
    assert one_f_one_b_time(*args) == pytest.approx(expected, rel=1e-12)
    assert simulate_1f1b(*args).makespan_s == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("m", "f", "b"), [(1, 1.0, 2.0), (7, 0.013, 0.029), (64, 5.0, 0.0)])
def test_single_stage_is_m_times_f_plus_b(m, f, b):
    assert one_f_one_b_time([f], [b], [], [], m) == pytest.approx(m * (f + b), rel=1e-12)
    assert simulate_1f1b([f], [b], [], [], m).makespan_s == pytest.approx(m * (f + b), rel=1e-12)


def test_hand_two_stage_with_latency():
    # p=2, m=2, f=1, b=2 on both stages, latency 0.5, transmit 0.  Stage 0: F0 F1 B0 B1 (one
    # warm-up forward); stage 1: F0 B0 F1 B1.
    #   st0 F0 [0, 1]  -> activation 0 at st1 at 1.5;  st0 F1 [1, 2] -> arrives 2.5
    #   st1 F0 [1.5, 2.5], B0 [2.5, 4.5] -> gradient 0 at st0 at 5.0
    #   st1 F1 [4.5, 5.5] (act. there since 2.5), B1 [5.5, 7.5] -> gradient 1 at st0 at 8.0
    #   st0 B0 [5, 7], B1 [max(7, 8) = 8, 10]                           => makespan 10
    # Critical path: f + 0.5 + (f + b + f + b) + 0.5 + b = 1 + .5 + 6 + .5 + 2 = 10.
    res = simulate_1f1b([1, 1], [2, 2], [0.5], [0.0], 2)
    assert res.makespan_s == pytest.approx(10.0)
    assert [(e.kind, e.micro_batch, e.start, e.end) for e in res.events[0]] == [
        ("F", 0, 0.0, 1.0),
        ("F", 1, 1.0, 2.0),
        ("B", 0, 5.0, 7.0),
        ("B", 1, 8.0, 10.0),
    ]
    assert [(e.kind, e.micro_batch, e.start, e.end) for e in res.events[1]] == [
        ("F", 0, 1.5, 2.5),
        ("B", 0, 2.5, 4.5),
        ("F", 1, 4.5, 5.5),
        ("B", 1, 5.5, 7.5),
    ]
    assert one_f_one_b_time([1, 1], [2, 2], [0.5], [0.0], 2) == pytest.approx(10.0)


def test_hand_two_stage_with_latency_and_transmit():
    # Same chain, transmit 1.5 (arrival = tx_start + 1.5 + 0.5):
    #   st0 F0 [0,1] tx [1, 2.5] -> 3.0;  F1 [1,2] tx [max(2, 2.5), 4] -> 4.5
    #   st1 F0 [3,4], B0 [4,6] tx [6, 7.5] -> 8;  F1 [6,7], B1 [7,9] tx [9, 10.5] -> 11
    #   st0 B0 [8,10], B1 [11,13]                                   => makespan 13
    args = ([1, 1], [2, 2], [0.5], [1.5], 2)
    assert simulate_1f1b(*args).makespan_s == pytest.approx(13.0)
    assert one_f_one_b_time(*args) == pytest.approx(13.0)


def test_hand_fifo_queueing_in_warm_up():
    # p=2, m=3, f=b=1, latency 0, transmit 3 > f: activations queue on the link.
    #   st0 F0 [0,1] tx [1,4] -> 4;  F1 [1,2] tx [4,7] -> 7
    #   st1 F0 [4,5], B0 [5,6] tx [6,9] -> 9;  F1 [7,8], B1 [8,9] tx [9,12] -> 12
    #   st0 B0 [9,10], F2 [10,11] tx [11,14] -> 14, B1 [12,13]
    #   st1 F2 [14,15], B2 [15,16] tx [16,19] -> 19;  st0 B2 [19,20]  => makespan 20
    args = ([1, 1], [1, 1], [0.0], [3.0], 3)
    assert simulate_1f1b(*args).makespan_s == pytest.approx(20.0)
    assert one_f_one_b_time(*args) == pytest.approx(20.0)


def test_hand_heterogeneous_where_round_trip_plus_period_overestimates():
    # p=2, m=2, stage 0 twice as slow: f=(2,1), b=(4,2), no communication.
    #   st0 F0 [0,2], F1 [2,4];  st1 F0 [2,3], B0 [3,5], F1 [5,6], B1 [6,8]
    #   st0 B0 [max(4, 5), 9], B1 [max(9, 8), 13]                      => makespan 13
    # The textbook "round trip + (m-1) * period" gives 9 + 6 = 15.
    args = ([2, 1], [4, 2], [0.0], [0.0], 2)
    assert simulate_1f1b(*args).makespan_s == pytest.approx(13.0)
    assert one_f_one_b_time(*args) == pytest.approx(13.0)
    round_trip = 2 + 1 + 2 + 4
    assert round_trip + (2 - 1) * steady_state_period(*args[:4]) == pytest.approx(15.0)


def test_steady_state_period_hand_values():
    # Uniform, no communication: every stage's own f + b.
    assert steady_state_period([1] * 4, [2] * 4, [0] * 3, [0] * 3) == pytest.approx(3.0)
    # Two stages, latency 5: the round trip (1+2) + (1+2) + 2*5 = 16 carries 2 micro-batches.
    assert steady_state_period([1, 1], [2, 2], [5.0], [0.0]) == pytest.approx(8.0)
    # Transmit enters the round trip twice: (3 + 3 + 2 * 4) / 2 = 7 (so it always dominates
    # the FIFO's own bound of 4 s per message).
    assert steady_state_period([1, 1], [2, 2], [0.0], [4.0]) == pytest.approx(7.0)
    # Latency-bound: two extra micro-batches add one round trip (16 s) once m is large.
    t20 = one_f_one_b_time([1, 1], [2, 2], [5.0], [0.0], 20)
    t22 = one_f_one_b_time([1, 1], [2, 2], [5.0], [0.0], 22)
    assert t22 - t20 == pytest.approx(16.0)


def test_bubble_fraction_hand_values():
    assert bubble_fraction(1, 5) == 0.0
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(8, 8) == pytest.approx(7 / 15)
    assert bubble_fraction(2, 1) == pytest.approx(0.5)
    fractions = [bubble_fraction(8, m) for m in range(1, 200)]
    assert all(a > b for a, b in zip(fractions, fractions[1:], strict=False))
    assert fractions[-1] < 0.04


@pytest.mark.parametrize(("p", "m"), [(4, 8), (8, 8), (3, 1), (16, 64)])
def test_bubble_fraction_is_idle_share_of_uniform_simulation(p, m):
    t = simulate_1f1b([1.0] * p, [2.0] * p, [0.0] * (p - 1), [0.0] * (p - 1), m).makespan_s
    idle = 1.0 - m * 3.0 / t  # each stage is busy m (f + b) out of t
    assert bubble_fraction(p, m) == pytest.approx(idle, rel=1e-12)


@pytest.mark.parametrize(
    ("call", "kwargs"),
    [
        (one_f_one_b_time, {"fwd": [1, 1], "bwd": [1], "latency": [0], "transmit": [0], "m": 2}),
        (one_f_one_b_time, {"fwd": [1, 1], "bwd": [1, 1], "latency": [], "transmit": [0], "m": 2}),
        (simulate_1f1b, {"fwd": [1, 1], "bwd": [1, 1], "latency": [0], "transmit": [], "m": 2}),
        (simulate_1f1b, {"fwd": [], "bwd": [], "latency": [], "transmit": [], "m": 2}),
        (one_f_one_b_time, {"fwd": [1], "bwd": [1], "latency": [], "transmit": [], "m": 0}),
        (simulate_1f1b, {"fwd": [1], "bwd": [1], "latency": [], "transmit": [], "m": 1.5}),
        (one_f_one_b_time, {"fwd": [1], "bwd": [1], "latency": [], "transmit": [], "m": True}),
        (one_f_one_b_time, {"fwd": [-1], "bwd": [1], "latency": [], "transmit": [], "m": 1}),
        (simulate_1f1b, {"fwd": [1, 1], "bwd": [1, 1], "latency": [-0.1], "transmit": [0], "m": 1}),
        (
            one_f_one_b_time,
            {"fwd": [1, 1], "bwd": [1, 1], "latency": [0], "transmit": [math.nan], "m": 1},
        ),
        (simulate_1f1b, {"fwd": [math.inf], "bwd": [1], "latency": [], "transmit": [], "m": 1}),
    ],
)
def test_invalid_inputs_raise(call, kwargs):
    with pytest.raises(ValueError):
        call(**kwargs)


def test_bubble_fraction_validation():
    for p, m in [(0, 4), (4, 0), (2.0, 4), (True, 4)]:
        with pytest.raises(ValueError):
            bubble_fraction(p, m)


# ---------------------------------------------------------------------------------------------
# Random cases


@st.composite
def target_domain(draw, max_p: int = 16):
    """Stages of 5-50 ms compute within 2x of each other, latency <= 5 ms, transmit <= compute."""
    p = draw(st.integers(1, max_p))
    m = draw(st.integers(p, 8 * p))
    base = draw(st.floats(5e-3, 50e-3))
    slow = draw(st.lists(st.floats(1.0, 2.0), min_size=p, max_size=p))
    split = draw(st.lists(st.floats(0.25, 0.5), min_size=p, max_size=p))  # forward share
    fwd = [base * s * q for s, q in zip(slow, split, strict=True)]
    bwd = [base * s * (1.0 - q) for s, q in zip(slow, split, strict=True)]
    latency = draw(st.lists(st.floats(0.0, 5e-3), min_size=p - 1, max_size=p - 1))
    transmit = draw(st.lists(st.floats(0.0, 2.0 * base), min_size=p - 1, max_size=p - 1))
    return fwd, bwd, latency, transmit, m


_any_time = st.one_of(st.just(0.0), st.floats(0.0, 1.0), st.floats(0.0, 20.0))


@st.composite
def extreme_cases(draw, max_p: int = 8):
    """Any non-negative times (zeros, 20x spreads), m from 1 (m < p included) to 3p."""
    p = draw(st.integers(1, max_p))
    m = draw(st.integers(1, 3 * p))
    times = st.lists(_any_time, min_size=p, max_size=p)
    links = st.lists(_any_time, min_size=p - 1, max_size=p - 1)
    return draw(times), draw(times), draw(links), draw(links), m


@settings(max_examples=200, deadline=None)
@given(target_domain())
def test_closed_form_matches_simulator_in_target_domain(case):
    sim = simulate_1f1b(*case).makespan_s
    closed = one_f_one_b_time(*case)
    rel = abs(closed - sim) / sim
    assert rel <= 0.01  # the contract
    assert rel <= 1e-9  # observed: exact up to rounding


@settings(max_examples=150, deadline=None)
@given(extreme_cases())
def test_closed_form_exact_on_extreme_inputs(case):
    sim = simulate_1f1b(*case).makespan_s
    assert one_f_one_b_time(*case) == pytest.approx(sim, rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.one_of(target_domain(max_p=10), extreme_cases()))
def test_simulator_respects_schedule_and_dependencies(case):
    fwd, bwd, latency, transmit, m = case
    p = len(fwd)
    res = simulate_1f1b(*case)
    ev = res.events
    assert len(ev) == p
    eps = 1e-9 * (1.0 + res.makespan_s)
    done: dict[tuple[str, int, int], tuple[float, float]] = {}
    for k, stage in enumerate(ev):
        # counts: every micro-batch once forward and once backward
        assert sorted(e.micro_batch for e in stage if e.kind == "F") == list(range(m))
        assert sorted(e.micro_batch for e in stage if e.kind == "B") == list(range(m))
        # 1F1B: min(p - k, m) forwards before the first backward, then strict alternation
        kinds = "".join(e.kind for e in stage)
        lead = min(p - k, m)
        assert kinds.startswith("F" * lead + "B")
        assert "FF" not in kinds[lead - 1 :]
        assert [(e.kind, e.micro_batch) for e in stage] == one_f_one_b_order(p, m, k)
        prev_end = 0.0
        for e in stage:
            assert e.end - e.start == pytest.approx(fwd[k] if e.kind == "F" else bwd[k])
            assert e.start >= prev_end - eps  # one op at a time
            prev_end = e.end
            done[(e.kind, k, e.micro_batch)] = (e.start, e.end)
    assert res.makespan_s == max(stage[-1].end for stage in ev)
    for k in range(p):
        assert res.makespan_s >= m * (fwd[k] + bwd[k]) - eps
        for i in range(m):
            assert done[("B", k, i)][0] >= done[("F", k, i)][1] - eps
    # Re-derive every start time from the events: FIFO transmit starts, arrivals, and
    # start = max(stage free, input arrival) (no op waits longer than it must).
    arrival: dict[tuple[str, int, int], float] = {}
    for j in range(p - 1):
        for kind, src, dst in (("F", j, j + 1), ("B", j + 1, j)):
            link_free = 0.0
            for i in range(m):
                tx_start = max(done[(kind, src, i)][1], link_free)
                link_free = tx_start + transmit[j]
                arrival[(kind, dst, i)] = tx_start + transmit[j] + latency[j]
    for k, stage in enumerate(ev):
        prev_end = 0.0
        for e in stage:
            if e.kind == "F":
                ready = 0.0 if k == 0 else arrival[("F", k, e.micro_batch)]
            else:
                ready = (
                    done[("F", k, e.micro_batch)][1]
                    if k == p - 1
                    else arrival[("B", k, e.micro_batch)]
                )
            assert e.start == pytest.approx(max(prev_end, ready), rel=1e-12, abs=eps)
            prev_end = e.end


# ---------------------------------------------------------------------------------------------
# Vectorized closed form vs the pure-Python reference


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b) if b else abs(a)


_spread_time = st.one_of(
    st.just(0.0), st.floats(0.0, 1e-3), st.floats(5e-3, 50e-3), st.floats(0.0, 1.0)
)


@st.composite
def reference_cases(draw, max_p: int = 24):
    """Heterogeneous stage, latency and transmit times (zeros, 1000x spreads), m from 1 to 8p."""
    p = draw(st.integers(1, max_p))
    m = draw(st.integers(1, 8 * p))
    times = st.lists(_spread_time, min_size=p, max_size=p)
    links = st.lists(_spread_time, min_size=p - 1, max_size=p - 1)
    return draw(times), draw(times), draw(links), draw(links), m


@settings(max_examples=300, deadline=None)
@given(st.one_of(reference_cases(), target_domain(max_p=24), extreme_cases(max_p=24)))
def test_closed_form_equals_reference(case):
    ref = _reference_one_f_one_b_time(*case)
    assert _rel(one_f_one_b_time(*case), ref) <= 1e-12
    # Both evaluation paths (scalar loop, numpy vector per slot), whatever the stage count.
    for threshold in (1, 10**9):
        with mock.patch.object(pipeline, "_NUMPY_MIN_STAGES", threshold):
            assert _rel(one_f_one_b_time(*case), ref) <= 1e-12


def _random_chain(p: int, m: int, seed: int, comm: float = 1.0):
    rng = random.Random(seed)
    fwd = [rng.uniform(5e-3, 50e-3) for _ in range(p)]
    bwd = [x * rng.uniform(1.0, 3.0) for x in fwd]
    latency = [comm * rng.uniform(0.0, 5e-3) for _ in range(p - 1)]
    transmit = [comm * rng.uniform(0.0, 40e-3) for _ in range(p - 1)]
    return fwd, bwd, latency, transmit, m


@pytest.mark.parametrize(
    ("p", "m"),
    [(16, 15), (16, 16), (17, 16), (24, 20), (32, 48), (48, 72), (64, 1), (64, 40), (64, 96)]
    + [(64, 100), (64, 200)],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closed_form_equals_reference_large_chains(p, m, seed):
    for comm in (0.0, 0.1, 1.0, 10.0):
        case = _random_chain(p, m, seed, comm)
        assert _rel(one_f_one_b_time(*case), _reference_one_f_one_b_time(*case)) <= 1e-12


@pytest.mark.parametrize(("p", "m"), [(32, 48), (64, 96)])
def test_closed_form_matches_simulator_large_chains(p, m):
    case = _random_chain(p, m, seed=7)
    sim = simulate_1f1b(*case).makespan_s
    assert _rel(one_f_one_b_time(*case), sim) <= 1e-12


@pytest.mark.parametrize(("p", "m"), [(1, 50), (4, 6), (20, 30), (64, 96)])
def test_uniform_chain_with_communication_equals_reference(p, m):
    case = ([0.01] * p, [0.02] * p, [0.002] * (p - 1), [0.004] * (p - 1), m)
    assert _rel(one_f_one_b_time(*case), _reference_one_f_one_b_time(*case)) <= 1e-12
    assert _rel(one_f_one_b_time(*case), simulate_1f1b(*case).makespan_s) <= 1e-12
