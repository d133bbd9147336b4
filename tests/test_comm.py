"""Tests for placer.perf.comm: fiber, wave payload and collective formulas.

Every expected value is worked out by hand in the comment next to it (or is a figure from
the reference docs), never obtained by re-running the code under test.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from placer.perf.comm import (
    all_gather_s,
    fiber_one_way_s,
    hierarchical_allreduce_s,
    p2p_s,
    reduce_scatter_s,
    ring_allreduce_s,
    tree_allreduce_s,
    wave_payload_bytes_per_s,
)

GB = 1e9

# --------------------------------------------------------------------------- seed arithmetic
# performance-model.md "Seed article check" and hardware.md "Fiber".


def test_seed_1t_params_bf16_is_2tb_of_gradients() -> None:
    params = 1e12
    bytes_per_bf16 = 2
    assert params * bytes_per_bf16 == 2e12


def test_seed_800g_wave_is_100_gb_per_s() -> None:
    # 800 Gbit/s / 8 bit/byte = 100 GB/s line rate
    assert wave_payload_bytes_per_s(800) == pytest.approx(100 * GB, rel=1e-12)
    # hardware.md assumption: 0.9 usable -> 90 GB/s
    assert wave_payload_bytes_per_s(800, 0.9) == pytest.approx(90 * GB, rel=1e-12)
    # 400ZR: 400/8 = 50 GB/s
    assert wave_payload_bytes_per_s(400) == pytest.approx(50 * GB, rel=1e-12)


def test_seed_two_sites_pure_dp_one_wave_needs_20_s() -> None:
    # k=2: each site's WAN carries 2(2-1)/2 * 2 TB = 2 TB at 100 GB/s -> 20 s
    t = hierarchical_allreduce_s(
        n_local=1, k_sites=2, nbytes=2e12, local_bw=1e12, wan_bw=wave_payload_bytes_per_s(800)
    )
    assert t == pytest.approx(20.0, rel=1e-12)


def test_seed_fiber_delays() -> None:
    # 100 km * 4.9 us/km = 490 us one way
    assert fiber_one_way_s(100, 4.9) == pytest.approx(0.49e-3, rel=1e-12)
    # 500 km round trip: 2 * 500 * 4.9 us = 4.9 ms (seed article: ~5 ms)
    assert 2 * fiber_one_way_s(500, 4.9) == pytest.approx(4.9e-3, rel=1e-12)
    # seed article's rounding, 5 us/km: 100 km -> 0.5 ms
    assert fiber_one_way_s(100, 5.0) == pytest.approx(0.5e-3, rel=1e-12)
    assert fiber_one_way_s(0, 4.9) == 0.0


# --------------------------------------------------------------------------- point to point


def test_p2p_hand_values() -> None:
    # 1 GB at 10 GB/s = 0.1 s, + 1 ms latency
    assert p2p_s(GB, 10 * GB) == pytest.approx(0.1, rel=1e-12)
    assert p2p_s(GB, 10 * GB, latency_s=1e-3) == pytest.approx(0.101, rel=1e-12)
    assert p2p_s(0, 10 * GB, latency_s=2e-3) == pytest.approx(2e-3, rel=1e-12)


# --------------------------------------------------------------------------- ring family


def test_ring_allreduce_hand_values() -> None:
    # n=4, 1 GB, 10 GB/s: 2*3/4 * 0.1 s = 0.15 s
    assert ring_allreduce_s(4, GB, 10 * GB) == pytest.approx(0.15, rel=1e-12)
    # + 2*(4-1) = 6 hops of 1 ms
    assert ring_allreduce_s(4, GB, 10 * GB, alpha_s=1e-3) == pytest.approx(0.156, rel=1e-12)
    # n=2: 2*1/2 * 0.1 = 0.1 s
    assert ring_allreduce_s(2, GB, 10 * GB) == pytest.approx(0.1, rel=1e-12)
    # n=8, 8 GB, 100 GB/s: 2*7/8 * 0.08 = 0.14 s
    assert ring_allreduce_s(8, 8 * GB, 100 * GB) == pytest.approx(0.14, rel=1e-12)


@pytest.mark.parametrize("fn", [ring_allreduce_s, reduce_scatter_s, all_gather_s, tree_allreduce_s])
@pytest.mark.parametrize("n", [0, 1])
def test_trivial_groups_cost_nothing(fn, n: int) -> None:
    assert fn(n, GB, 10 * GB, alpha_s=1.0) == 0.0


def test_reduce_scatter_and_all_gather_hand_values() -> None:
    # n=4, 1 GB, 10 GB/s: 3/4 * 0.1 = 0.075 s, + 3 hops of 1 ms
    assert reduce_scatter_s(4, GB, 10 * GB) == pytest.approx(0.075, rel=1e-12)
    assert reduce_scatter_s(4, GB, 10 * GB, alpha_s=1e-3) == pytest.approx(0.078, rel=1e-12)
    assert all_gather_s(4, GB, 10 * GB, alpha_s=1e-3) == pytest.approx(0.078, rel=1e-12)


@given(
    n=st.integers(min_value=2, max_value=4096),
    nbytes=st.floats(min_value=1.0, max_value=1e13),
    bw=st.floats(min_value=1e6, max_value=1e13),
    alpha=st.floats(min_value=0.0, max_value=1e-2),
)
def test_ring_is_reduce_scatter_plus_all_gather(
    n: int, nbytes: float, bw: float, alpha: float
) -> None:
    # Ring all-reduce is by construction RS then AG; its closed form 2(n-1)/n S/bw + 2(n-1)a
    expected = 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha
    rs_ag = reduce_scatter_s(n, nbytes, bw, alpha) + all_gather_s(n, nbytes, bw, alpha)
    assert rs_ag == pytest.approx(expected, rel=1e-9)
    assert ring_allreduce_s(n, nbytes, bw, alpha) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    "n, expected",
    [
        # bandwidth term 2 * 1 GB / 10 GB/s = 0.2 s; latency 2*ceil(log2 n) hops of 1 ms
        (2, 0.202),  # ceil(log2 2) = 1
        (4, 0.204),  # 2
        (5, 0.206),  # 3
        (8, 0.206),  # 3
        (9, 0.208),  # 4
        (1024, 0.22),  # 10
    ],
)
def test_tree_allreduce_hand_values(n: int, expected: float) -> None:
    assert tree_allreduce_s(n, GB, 10 * GB, alpha_s=1e-3) == pytest.approx(expected, rel=1e-12)


def test_tree_beats_ring_for_small_messages_over_wan_latency() -> None:
    # 64 members, 1 MB, 100 GB/s, alpha = 100 km of fiber (0.49 ms)
    # ring: 2*63/64*1e-5 + 126*0.49e-3 = 1.96875e-5 + 61.74e-3
    # tree: 2*1e-5 + 2*6*0.49e-3 = 2e-5 + 5.88e-3
    a = 0.49e-3
    ring = ring_allreduce_s(64, 1e6, 100 * GB, a)
    tree = tree_allreduce_s(64, 1e6, 100 * GB, a)
    assert ring == pytest.approx(1.96875e-5 + 61.74e-3, rel=1e-12)
    assert tree == pytest.approx(2e-5 + 5.88e-3, rel=1e-12)
    assert tree < ring


# --------------------------------------------------------------------------- hierarchical


def test_hierarchical_single_site_is_intra_ring() -> None:
    # k=1, 8 members, 1 GB, 400 GB/s, 1 us per hop:
    # RS + AG = 2 * (7/8 * 1e9/4e11 + 7 * 1e-6) = 4.375e-3 + 14e-6
    t = hierarchical_allreduce_s(
        n_local=8,
        k_sites=1,
        nbytes=GB,
        local_bw=400 * GB,
        wan_bw=1.0,
        local_alpha_s=1e-6,
        wan_alpha_s=1.0,
    )
    assert t == pytest.approx(4.375e-3 + 14e-6, rel=1e-12)


def test_hierarchical_three_sites_hand_value() -> None:
    # n_local=4, k=3, S=3 GB, local 300 GB/s, WAN 50 GB/s per site, WAN alpha 1 ms:
    # intra: 2 * 3/4 * 3e9/3e11 = 15 ms
    # inter: 2*2/3 * 3e9/5e10 = 80 ms, + 2*2 hops * 1 ms = 4 ms
    t = hierarchical_allreduce_s(4, 3, 3 * GB, 300 * GB, 50 * GB, wan_alpha_s=1e-3)
    assert t == pytest.approx(15e-3 + 80e-3 + 4e-3, rel=1e-12)


def test_hierarchical_beats_flat_ring_for_two_sites() -> None:
    # hardware.md: NeMo/Megatron-Core reach 96% cross-DC scaling with hierarchical
    # all-reduce. Hand-worked case: 2 sites x 8 members, S = 1 GB, 400 GB/s inside,
    # 100 GB/s WAN per site per direction, 100 km of fiber (0.49 ms per WAN hop).
    s, local_bw, wan_bw, wan_a = GB, 400 * GB, 100 * GB, 0.49e-3
    # Hierarchical: intra RS+AG 2*7/8*1e9/4e11 = 4.375 ms; WAN 2*1/2*1e9/1e11 = 10 ms;
    # latency 2*(2-1) WAN hops = 0.98 ms.  Total 15.355 ms.
    hier = hierarchical_allreduce_s(8, 2, s, local_bw, wan_bw, 0.0, wan_a)
    assert hier == pytest.approx(15.355e-3, rel=1e-12)
    # Flat ring over 16 members: every link, including the WAN crossing, carries
    # 2*15/16 * 1 GB = 1.875 GB, so the WAN link sets the pace: 18.75 ms; each of the
    # 2*15 = 30 lock-step hops waits for the WAN hop: 30 * 0.49 ms = 14.7 ms. Total 33.45 ms.
    flat = ring_allreduce_s(16, s, wan_bw, wan_a)
    assert flat == pytest.approx(33.45e-3, rel=1e-12)
    assert hier < flat
    # Bandwidth terms alone also favour hierarchical: 14.375 ms vs 18.75 ms.
    assert hierarchical_allreduce_s(8, 2, s, local_bw, wan_bw) == pytest.approx(
        14.375e-3, rel=1e-12
    )
    assert ring_allreduce_s(16, s, wan_bw) == pytest.approx(18.75e-3, rel=1e-12)


@given(n_local=st.integers(min_value=1, max_value=256), k=st.integers(min_value=2, max_value=16))
def test_hierarchical_wan_bytes_independent_of_site_size(n_local: int, k: int) -> None:
    # With a very fast LAN, time -> WAN term 2(k-1)/k * S / wan_bw, whatever n_local is
    # (performance-model.md: each site's WAN carries ~2(k-1)/k * S per sync).
    t = hierarchical_allreduce_s(n_local, k, 1e12, local_bw=1e30, wan_bw=1e11)
    assert t == pytest.approx(2 * (k - 1) / k * 10.0, rel=1e-9)


# --------------------------------------------------------------------------- invalid input


@pytest.mark.parametrize(
    "call",
    [
        lambda: fiber_one_way_s(-1, 4.9),
        lambda: fiber_one_way_s(10, -4.9),
        lambda: fiber_one_way_s(math.nan, 4.9),
        lambda: wave_payload_bytes_per_s(-800),
        lambda: wave_payload_bytes_per_s(800, 0.0),
        lambda: wave_payload_bytes_per_s(800, 1.1),
        lambda: p2p_s(GB, 0.0),
        lambda: p2p_s(-1, GB),
        lambda: p2p_s(GB, GB, latency_s=-1e-3),
        lambda: ring_allreduce_s(-1, GB, GB),
        lambda: ring_allreduce_s(4, GB, 0.0),
        lambda: ring_allreduce_s(4, GB, GB, alpha_s=-1.0),
        lambda: ring_allreduce_s(2.5, GB, GB),
        lambda: reduce_scatter_s(4, -GB, GB),
        lambda: tree_allreduce_s(4, GB, -GB),
        lambda: hierarchical_allreduce_s(0, 2, GB, GB, GB),
        lambda: hierarchical_allreduce_s(4, 0, GB, GB, GB),
        lambda: hierarchical_allreduce_s(4, 2, GB, GB, 0.0),
        lambda: hierarchical_allreduce_s(4, 2, GB, GB, GB, wan_alpha_s=-1.0),
    ],
)
def test_invalid_arguments_raise(call) -> None:
    with pytest.raises(ValueError):
        call()
