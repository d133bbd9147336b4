"""DeepSeek-V3's EP internode dispatch and combine (deepep dispatcher) against DeepEP's
published normal-kernel bandwidths (issue 16 item 6).

Source: deepseek-ai/DeepEP `docs/legacy.md` "Normal kernels with NVLink and RDMA forwarding"
(the V1 README table): H800 (~160 GB/s NVLink), one CX7 400 Gb/s InfiniBand NIC per GPU
(~50 GB/s), DeepSeek-V3 pre-training setting: 4096 tokens per batch, hidden 7168, top-4
groups (nodes), top-8 of 256 experts, FP8 dispatch, BF16 combine. Measured "bottleneck
bandwidth" (GB/s): EP 16 43 / 43 (dispatch / combine, RDMA), EP 32 58 / 57, EP 64 51 / 50.

How DeepEP counts those bytes (its V1 `tests/test_internode.py`): `num_rdma_token_sent` =
the distinct destination nodes of every token, the sender's own node included, times
hidden x 2 bytes (x (1 + 4/128) / 2 for FP8 dispatch); time = those bytes / bandwidth. The
V2 README says so in words: "the results are logical bandwidth ... contains local rank
traffic". So the published time of one dispatch is D T h v / BW with D the expected
destination nodes per token, T the rank's tokens, v the bytes per value; placer's NIC
carries only the remote share D (N - 1) / N of it.

Every expected figure below is written out by hand from those numbers, not read back from
placer.perf.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from placer.io import build_catalog, problem_from_data
from placer.perf.compute import expected_token_nodes
from placer.perf.step import PerfModel

HIDDEN, EXPERTS, TOP_K, NODE_LIMIT = 7168, 256, 8, 4  # DeepSeek-V3 (arXiv 2412.19437 2.1.2)
GPUS_PER_NODE = 8
BF16, FP8 = 2.0, 1 + 4 / 128  # FP8 value + fp32 scale per 1 x 128 tile (section 3.3)
# DeepEP legacy.md, normal kernels on H800 + CX7: EP -> (dispatch, combine) GB/s, logical
DEEPEP_GBPS = {16: (43, 43), 32: (58, 57), 64: (51, 50)}


def _dest_nodes_by_hand(nodes: int) -> float:
    """Expected distinct nodes of a token's 8 experts, the node limit M = min(4, N) nodes
    allowed and the 8 picks uniform over their 32 M experts (the balanced-routing
    assumption): each allowed node is empty when all 8 picks miss its 32 experts."""
    m = min(NODE_LIMIT, nodes)
    per = EXPERTS // nodes
    miss = math.prod((per * m - per - i) / (per * m - i) for i in range(TOP_K))
    return m * (1 - miss)


def _perf(gpu: str, catalog: dict | None = None) -> PerfModel:
    inst = {
        "name": "deepep",
        "sites": [{"name": "dc", "gpu": gpu, "gpus": 1024}],
        "job": {
            "model": "deepseek-v3",
            "global_batch": 1024,
            "precision": "fp8",
            "moe_dispatcher": "deepep",
            "moe_dispatch_precision": "fp8",
        },
    }
    if catalog:
        inst["catalog"] = catalog
    return PerfModel(problem_from_data(inst))


def _h800() -> tuple[PerfModel, object]:
    """The H800 as an instance catalog addition: the H100 SXM with 400 GB/s NVLink (both
    directions), the part DeepEP measured on (as benchmarks/moe_bench.py builds it)."""
    spec = build_catalog().gpus["h100-sxm"].model_dump(exclude_none=True)
    spec["nvlink_gbytes_per_s_bidir"] = 400
    spec["source"] = "assumption: h100-sxm with the H800's 400 GB/s NVLink"
    perf = _perf("h800", {"gpus": {"h800": spec}})
    return perf, perf.catalog.gpus["h800"]


def test_destination_nodes_by_hand() -> None:
    """D at EP 64 (8 nodes, 4 allowed): 4 (1 - C(96, 8) / C(128, 8)) = 3.629; EP 32
    (4 nodes, all allowed): 3.614; EP 16: 1.993."""
    assert _dest_nodes_by_hand(8) == pytest.approx(
        4 * (1 - math.comb(96, 8) / math.comb(128, 8)), rel=1e-12
    )
    assert _dest_nodes_by_hand(8) == pytest.approx(3.629, abs=1e-3)
    assert _dest_nodes_by_hand(4) == pytest.approx(3.614, abs=1e-3)
    assert _dest_nodes_by_hand(2) == pytest.approx(1.993, abs=1e-3)
    for n in (2, 4, 8):
        assert expected_token_nodes(EXPERTS, TOP_K, n, NODE_LIMIT) == pytest.approx(
            _dest_nodes_by_hand(n), rel=1e-12
        )


def test_destination_nodes_against_deepep_benchmark_router_at_ep32() -> None:
    """At EP 32 (4 nodes, DeepEP's benchmark allows min(nodes, 4) = all 4 groups) its router
    (`test_internode.py`: scores |N(0, 1)| + 1, the 4 best groups by their max, top-8 of the
    unmasked experts) is plain top-8 of i.i.d. scores, i.e. uniform: placer's D must match
    the router's simulated D. (At EP 64 the group selection biases the picks towards the 4
    chosen nodes: the router reaches 3.98 nodes against the uniform 3.63, see
    benchmarks/README.md "DeepEP's published bandwidth"; not asserted here.)"""
    rng = np.random.default_rng(0)
    tokens, nodes = 4000, 4
    scores = np.abs(rng.standard_normal((tokens, EXPERTS))) + 1
    top = np.argpartition(-scores, TOP_K, axis=1)[:, :TOP_K]
    node = top // (EXPERTS // nodes)
    d_router = np.mean([len(set(r)) for r in node])
    assert d_router == pytest.approx(expected_token_nodes(EXPERTS, TOP_K, nodes, 4), rel=0.01)


@pytest.mark.parametrize("ep", sorted(DEEPEP_GBPS))
def test_h800_dispatch_and_combine_at_deepep_published_bandwidth(ep: int) -> None:
    """One FP8 dispatch and one BF16 combine of 4096 tokens (tp 1) at EP 16 / 32 / 64 on
    H800: placer's deepep time within 7% of DeepEP's measured time, D T h v / BW.

    Hand figures at EP 64: D = 3.629, logical FP8 dispatch bytes 3.629 x 4096 x 7168 x
    1.03125 = 109.9 MB -> 2.154 ms at 51 GB/s; BF16 combine 213.1 MB -> 4.262 ms at 50 GB/s.
    placer: the NIC share 7/8 of it at 400 Gb/s x nic_efficiency 0.9 = 45 GB/s, i.e. an
    implied 45 x 8/7 = 51.4 GB/s logical: the catalog's 0.9 is what DeepEP achieves at EP 64
    (51 x 7/8 = 44.6 GB/s of the 50 GB/s NIC) and at EP 32 (58 x 3/4 = 43.5 GB/s). At EP 16
    (2 nodes) both DeepEP and placer are bound by the NVLink forwarding, 7 of 8 copies at
    160 GB/s: 43 vs 45.6 GB/s logical."""
    perf, gpu = _h800()
    tokens = 4096
    d = _dest_nodes_by_hand(ep // GPUS_PER_NODE)
    bw_dispatch, bw_combine = (x * 1e9 for x in DEEPEP_GBPS[ep])
    published_dispatch = d * tokens * HIDDEN * FP8 / bw_dispatch
    published_combine = d * tokens * HIDDEN * BF16 / bw_combine
    dispatch = perf.ep_all_to_all_s(gpu, 1, 1, ep, 1, 1.0, "deepep", "fp8")
    combine = perf.ep_all_to_all_s(gpu, 1, 1, ep, 1, 1.0, "deepep", "bf16")
    assert dispatch == pytest.approx(published_dispatch, rel=0.07)
    assert combine == pytest.approx(published_combine, rel=0.07)
    if ep == 64:
        assert published_dispatch == pytest.approx(2.154e-3, rel=1e-3)
        assert published_combine == pytest.approx(4.262e-3, rel=1e-3)


def test_h100_row_bytes_and_time_per_moe_layer() -> None:
    """Megatron-Bridge's DeepSeek-V3 H100 row (25.09: 1024 GPUs, tp 2, pp 8, ep 64, mb 1,
    seq 4096, deepep dispatcher): one MoE layer of one micro-batch sends 4 all-to-alls
    (dispatch + combine forward, their two gradients backward), all BF16 (Megatron-Core
    0.16.1 has no FP8 DeepEP dispatch). Per GPU: T = 4096 / tp 2 = 2048 tokens,
    D = 3.629 -> NIC bytes 4 x 3.629 x 7/8 x 2048 x 7168 x 2 = 373 MB per MoE layer; at
    DeepEP's published 50 GB/s logical (4 x 3.629 x 2048 x 14336 B = 426 MB) that is
    8.52 ms, and placer's four deepep all-to-alls come to 8.43 ms (within 2%)."""
    perf = _perf("h100-sxm")
    gpu = perf.catalog.gpus["h100-sxm"]
    tokens = 4096 // 2
    d = _dest_nodes_by_hand(8)
    nic_bytes = 4 * d * 7 / 8 * tokens * HIDDEN * BF16
    assert nic_bytes == pytest.approx(373e6, rel=2e-3)
    published = 4 * d * tokens * HIDDEN * BF16 / 50e9
    assert published == pytest.approx(8.52e-3, rel=2e-3)
    placer = 4 * perf.ep_all_to_all_s(gpu, 2, 1, 64, 1, 1.0, "deepep", "bf16")
    assert placer == pytest.approx(8.43e-3, rel=2e-3)
    assert placer == pytest.approx(published, rel=0.02)
    # the NIC term, by hand: bytes / (400 Gb/s x 0.9) plus 7 start-ups per all-to-all
    nic_bps = 400e9 / 8 * perf.catalog.network.nic_efficiency
    lat = perf.catalog.network.intra_site_latency_s
    assert placer == pytest.approx(nic_bytes / nic_bps + 4 * 7 * lat, rel=1e-9)
