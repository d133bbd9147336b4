"""placer.perf.critical_path: the longest path of a step and its supporting planes.

Oracles: the 1F1B closed form (placer.perf.pipeline.one_f_one_b_time, itself checked against
the ordered simulation) for v = 1; the interleaved bubble of Narayanan et al. (SC21, eq. 2:
(p - 1) / v micro-batch times) for uniform chunks without communication; and the closed form
re-evaluated at other transmit / latency times for the planes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from placer.perf.critical_path import critical_path, interleaved_order, service_order
from placer.perf.pipeline import one_f_one_b_time

_t = st.floats(0.0, 5.0, allow_nan=False)


@st.composite
def chains(draw):
    p = draw(st.integers(1, 7))
    m = draw(st.integers(1, 3 * p))
    f = draw(st.lists(_t, min_size=p, max_size=p))
    b = draw(st.lists(_t, min_size=p, max_size=p))
    lat = draw(st.lists(_t, min_size=p - 1, max_size=p - 1))
    tx = draw(st.lists(_t, min_size=p - 1, max_size=p - 1))
    lat2 = draw(st.lists(_t, min_size=p - 1, max_size=p - 1))
    tx2 = draw(st.lists(_t, min_size=p - 1, max_size=p - 1))
    return p, m, f, b, lat, tx, lat2, tx2


@settings(max_examples=300, deadline=None)
@given(case=chains())
def test_makespan_is_the_closed_form_and_every_plane_supports_it(case) -> None:
    p, m, f, b, lat, tx, lat2, tx2 = case
    path = critical_path(f, b, lat, tx, m)
    assert path.makespan_s == pytest.approx(
        one_f_one_b_time(f, b, lat, tx, m), rel=1e-12, abs=1e-12
    )
    const, n, lc = path.plane(tx, lat)
    at_point = const + sum(a * x for a, x in zip(n, tx, strict=True))
    at_point += sum(a * x for a, x in zip(lc, lat, strict=True))
    assert at_point == pytest.approx(path.makespan_s, rel=1e-12, abs=1e-12)  # tight where cut
    elsewhere = const + sum(a * x for a, x in zip(n, tx2, strict=True))
    elsewhere += sum(a * x for a, x in zip(lc, lat2, strict=True))
    assert elsewhere <= one_f_one_b_time(f, b, lat2, tx2, m) + 1e-9  # below everywhere
    # every micro-batch's message is one FIFO slot per direction: at most 2 m per boundary
    assert all(0 <= c <= 2 * m for c in n) and all(0 <= c <= 2 * m for c in lc)


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 16, 3), (8, 16, 4)])
def test_interleaved_bubble_is_p_minus_1_over_v(p, m, v) -> None:
    """Uniform stages, no communication: m (f + b) + (p - 1)(f + b) / v."""
    f, b = 0.3, 0.7
    path = critical_path([f / v] * (p * v), [b / v] * (p * v), [0.0] * p, [0.0] * p, m, v)
    assert path.makespan_s == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v, rel=1e-12)


def test_the_wrap_boundary_is_crossed_by_interleaved_chains() -> None:
    """With v = 2 every micro-batch crosses the wrap (rank p-1 -> 0) once forward and once
    backward: a slow wrap delivery shows on the critical path; with v = 1 nothing uses it."""
    p, m, v = 2, 4, 2
    f = [0.1] * (p * v)
    slow_wrap = critical_path(f, f, [0.0, 1.0], [0.0, 0.0], m, v)
    fast = critical_path(f, f, [0.0, 0.0], [0.0, 0.0], m, v)
    assert slow_wrap.latency_count[1] >= 2
    assert slow_wrap.makespan_s >= fast.makespan_s + 2 * 1.0 - 1e-12


def test_interleaved_order_runs_every_chunk_forward_and_backward_once() -> None:
    p, m, v = 4, 8, 3
    for r in range(p):
        ops = interleaved_order(p, m, v, r)
        stages = {s for _, _, s in ops}
        assert stages == {c * p + r for c in range(v)}
        assert sorted(ops) == sorted((k, x, s) for k in "FB" for x in range(m) for s in stages)
    with pytest.raises(ValueError, match="multiple of pp"):
        interleaved_order(4, 6, 2, 0)


def test_a_transmit_time_per_message_by_hand() -> None:
    """transmit_of gives each message its own transmit time (the per-op tick experiment,
    benchmarks/coincident_ticks.py). p = 2, m = 1: F0 1 s, the activation 3 s, 0.5 s of
    fiber, F1 1 s, B1 2 s, the gradient 5 s, 0.5 s, B0 2 s: 15 s in series (7.2 s with the
    boundary's own 0.1 s both ways)."""
    f, b, lat, tx = [1.0, 1.0], [2.0, 2.0], [0.5], [0.1]
    assert critical_path(f, b, lat, tx, 1).makespan_s == pytest.approx(7.2)
    per_kind = critical_path(
        f, b, lat, tx, 1, transmit_of=lambda msg, j: 3.0 if msg[0] == "F" else 5.0
    )
    assert per_kind.makespan_s == pytest.approx(15.0)
    # p = 2, m = 2, no fiber, free messages but micro-batch 1's activation (10 s): stage 1
    # runs F0 [1, 2], B0 [2, 4], then waits for that activation (sent at 2 when stage 0's
    # F1 ends, there at 12): F1 [12, 13], B1 [13, 15]; stage 0's B1 [15, 17]
    slow = critical_path(
        f, b, [0.0], [0.0], 2, transmit_of=lambda msg, j: 10.0 if msg == ("F", 1, 1) else 0.0
    )
    assert slow.makespan_s == pytest.approx(17.0)


@settings(max_examples=200, deadline=None)
@given(case=chains())
def test_transmit_of_the_boundary_time_changes_nothing(case) -> None:
    """Given each message its boundary's own transmit time, the makespan is the same to the
    bit, with each boundary on its FIFOs and with all boundaries sharing one per direction
    (a shared FIFO held for the part above the NIC floor)."""
    p, m, f, b, lat, tx, _, _ = case
    same = critical_path(f, b, lat, tx, m, transmit_of=lambda msg, j: tx[j])
    assert same.makespan_s == critical_path(f, b, lat, tx, m).makespan_s
    if p >= 3:
        queues = [(0, 1)] * (p - 1)  # every boundary's activations on FIFO 0, gradients on 1
        service = service_order(f, b, lat, tx, m, 1, queues)
        floor = [t / 2 for t in tx]
        want = critical_path(f, b, lat, tx, m, 1, queues, service, floor)
        got = critical_path(f, b, lat, tx, m, 1, queues, service, floor, lambda msg, j: tx[j])
        assert got.makespan_s == want.makespan_s
        # and twice each boundary's time per message is the schedule of doubled transmits
        double = [2 * t for t in tx]
        want2 = critical_path(f, b, lat, double, m, 1, queues, service, floor)
        got2 = critical_path(f, b, lat, tx, m, 1, queues, service, floor, lambda msg, j: double[j])
        assert got2.makespan_s == pytest.approx(want2.makespan_s, rel=1e-12, abs=1e-12)
