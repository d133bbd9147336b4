"""Analytic communication model: fiber delay, wave payload, collectives, OptCC.

Pure functions, no hidden constants: every physical number (fiber delay per km, line
rate, efficiency, bandwidth, per-hop latency) is a parameter, so callers pass catalog
values and every figure in a report traces back to an input.

Units: seconds, bytes, bytes/s (``_Bps``), km. Bandwidths are per direction (full duplex).

Sources:
- /work/shared/reference/performance-model.md, "Data parallelism" (ring and hierarchical
  all-reduce, the 1T-parameter / 800G seed check).
- /work/shared/reference/hardware.md, "Fiber" (4.9 us/km) and "Coherent optics"
  (line rates, ~0.9 payload efficiency assumption).
- /work/shared/reference/optcc.md and Chen et al., "Don't Let a Few Network Failures Slow
  the Entire AllReduce", arXiv 2606.01680 (straggler model, lower bound, OptCC, R2CCL).
"""

from __future__ import annotations

import math

__all__ = [
    "fiber_one_way_s",
    "wave_payload_bytes_per_s",
    "p2p_s",
    "ring_allreduce_s",
    "reduce_scatter_s",
    "all_gather_s",
    "tree_allreduce_s",
    "hierarchical_allreduce_s",
    "all_to_all_s",
    "two_level_all_to_all_s",
    "ring_attention_kv_s",
    "ring_fault_free_s",
    "ring_degraded_s",
    "allreduce_lower_bound_s",
    "optcc_s",
    "r2ccl_s",
    "nic_loss_factor",
]

_BITS_PER_BYTE = 8  # definition, not a physical constant
_GIGA = 1e9  # SI prefix


# --------------------------------------------------------------------------- validation


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_nonneg(name: str, value: float) -> None:
    _require(math.isfinite(value) and value >= 0, f"{name} must be finite and >= 0, got {value!r}")


def _check_pos(name: str, value: float) -> None:
    _require(math.isfinite(value) and value > 0, f"{name} must be finite and > 0, got {value!r}")


def _check_members(name: str, value: int, minimum: int) -> None:
    _require(
        isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
        f"{name} must be an integer >= {minimum}, got {value!r}",
    )


def _check_collective(n: int, nbytes: float, bandwidth_Bps: float, alpha_s: float) -> None:
    # n >= 0 so that an empty group is a valid zero-cost case (n <= 1 -> 0 s).
    _check_members("n", n, 0)
    _check_nonneg("nbytes", nbytes)
    _check_pos("bandwidth_Bps", bandwidth_Bps)
    _check_nonneg("alpha_s", alpha_s)


# --------------------------------------------------------------------------- physical layer


def fiber_one_way_s(km: float, us_per_km: float) -> float:
    """One-way propagation delay over `km` of fiber.

    hardware.md "Fiber": SMF at 1550 nm has group index ~1.468, i.e. 4.9 us/km; the caller
    passes that catalog value so a different fiber type or rounding (5 us/km) is a data change.
    This is the per-hop alpha of any collective that crosses the WAN.
    """
    _check_nonneg("km", km)
    _check_nonneg("us_per_km", us_per_km)
    return km * us_per_km * 1e-6


def wave_payload_bytes_per_s(line_rate_gbps: float, efficiency: float = 1.0) -> float:
    """Usable bytes/s of one coherent wave: Gbit/s -> bytes/s, times payload efficiency.

    hardware.md "Coherent optics": an 800G wave is 100 GB/s of line rate; framing and RoCE
    overheads leave ~0.9 of it (an *assumption* the catalog carries, hence a parameter).
    """
    _check_nonneg("line_rate_gbps", line_rate_gbps)
    _require(0 < efficiency <= 1, f"efficiency must be in (0, 1], got {efficiency!r}")
    return line_rate_gbps * _GIGA / _BITS_PER_BYTE * efficiency


def p2p_s(nbytes: float, bandwidth_Bps: float, latency_s: float = 0.0) -> float:
    """Point-to-point transfer (alpha-beta model): latency + nbytes / bandwidth.

    Used for pipeline-parallel activations and any single-path transfer.
    """
    _check_nonneg("nbytes", nbytes)
    _check_pos("bandwidth_Bps", bandwidth_Bps)
    _check_nonneg("latency_s", latency_s)
    return latency_s + nbytes / bandwidth_Bps


# --------------------------------------------------------------------------- collectives


def ring_allreduce_s(n: int, nbytes: float, bandwidth_Bps: float, alpha_s: float = 0.0) -> float:
    """Ring all-reduce of `nbytes` per member over `n` members.

    performance-model.md "Data parallelism": 2(n-1)/n * S/bw + 2(n-1)*alpha. Ring is
    bandwidth-optimal (each member sends/receives 2(n-1)/n of the message) but pays
    2(n-1) sequential hops of latency, which dominates across sites for small messages.
    """
    _check_collective(n, nbytes, bandwidth_Bps, alpha_s)
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bandwidth_Bps + 2 * (n - 1) * alpha_s


def reduce_scatter_s(n: int, nbytes: float, bandwidth_Bps: float, alpha_s: float = 0.0) -> float:
    """Ring reduce-scatter: (n-1)/n * S/bw + (n-1)*alpha; the first half of a ring all-reduce.

    Each member ends with a reduced 1/n shard; this is the intra-site phase of the
    hierarchical all-reduce and the gradient phase of ZeRO/FSDP.
    """
    _check_collective(n, nbytes, bandwidth_Bps, alpha_s)
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bandwidth_Bps + (n - 1) * alpha_s


def all_gather_s(n: int, nbytes: float, bandwidth_Bps: float, alpha_s: float = 0.0) -> float:
    """Ring all-gather of a total of `nbytes` (1/n per member): same cost as reduce-scatter.

    All-gather is the mirror of reduce-scatter (same traffic, no reduction), so
    reduce_scatter + all_gather == ring all-reduce exactly.
    """
    return reduce_scatter_s(n, nbytes, bandwidth_Bps, alpha_s)


def tree_allreduce_s(n: int, nbytes: float, bandwidth_Bps: float, alpha_s: float = 0.0) -> float:
    """Double-binary-tree all-reduce (NCCL tree): 2*S/bw + 2*ceil(log2 n)*alpha.

    The bandwidth term is ~n/(n-1) worse than ring, but latency grows with log2(n)
    instead of n, so trees win for small messages or long per-hop latency.
    """
    _check_collective(n, nbytes, bandwidth_Bps, alpha_s)
    if n <= 1:
        return 0.0
    depth = (n - 1).bit_length()  # == ceil(log2 n) for integer n >= 2, exact (no float log)
    return 2 * nbytes / bandwidth_Bps + 2 * depth * alpha_s


def hierarchical_allreduce_s(
    n_local: int,
    k_sites: int,
    nbytes: float,
    local_bw: float,
    wan_bw: float,
    local_alpha_s: float = 0.0,
    wan_alpha_s: float = 0.0,
) -> float:
    """Hierarchical all-reduce across `k_sites` sites of `n_local` members each.

    performance-model.md "Data parallelism" and hardware.md (NeMo/Megatron-Core: reduce-
    scatter inside each DC, all-reduce between DCs, all-gather inside):

        T = RS(n_local, S, local_bw, local_alpha)                          # intra-site
          + 2(k-1)/k * S / wan_bw + 2(k-1) * wan_alpha                     # inter-site
          + AG(n_local, S, local_bw, local_alpha)                           # intra-site

    After the reduce-scatter each of the n_local members owns an S/n_local shard and
    all-reduces it with its peers at the other sites; summed over the site's members, the
    site's WAN carries 2(k-1)/k * S per sync whatever n_local is. `wan_bw` is the site's
    total WAN bandwidth (bytes/s per direction, e.g. waves x payload), shared by the
    parallel shard all-reduces; `local_bw` is the per-member intra-site bandwidth.
    The inter-site phase is ring-like (or mesh with the same per-site bytes): 2(k-1) hops
    of fiber delay. k_sites=1 reduces to a ring all-reduce inside the site.
    """
    _check_members("n_local", n_local, 1)
    _check_members("k_sites", k_sites, 1)
    _check_nonneg("nbytes", nbytes)
    _check_pos("local_bw", local_bw)
    _check_pos("wan_bw", wan_bw)
    _check_nonneg("local_alpha_s", local_alpha_s)
    _check_nonneg("wan_alpha_s", wan_alpha_s)
    intra = reduce_scatter_s(n_local, nbytes, local_bw, local_alpha_s) + all_gather_s(
        n_local, nbytes, local_bw, local_alpha_s
    )
    if k_sites == 1:
        return intra
    k = k_sites
    inter = 2 * (k - 1) / k * nbytes / wan_bw + 2 * (k - 1) * wan_alpha_s
    return intra + inter


def all_to_all_s(n: int, nbytes: float, bandwidth_Bps: float, alpha_s: float = 0.0) -> float:
    """All-to-all where each of `n` members sends `nbytes` in total, nbytes/n to every
    member (itself included, which costs nothing): (n-1)/n * S/bw + (n-1)*alpha.

    Pairwise-exchange model (NCCL runs it as n-1 concurrent send/recv pairs per member):
    the member's link carries (n-1)/n of its bytes each way; one start-up per peer. This
    is MoE token dispatch and combine over an expert-parallel group.
    """
    _check_collective(n, nbytes, bandwidth_Bps, alpha_s)
    if n <= 1:
        return 0.0
    return (n - 1) / n * nbytes / bandwidth_Bps + (n - 1) * alpha_s


def two_level_all_to_all_s(
    n: int,
    q: int,
    nbytes: float,
    local_bw: float,
    remote_bw: float,
    local_alpha_s: float = 0.0,
    remote_alpha_s: float = 0.0,
) -> float:
    """All-to-all over `n` members of which `q` share a scale-up domain (NVLink) with each
    sender: the (q-1)/n local share on NVLink and the (n-q)/n remote share on the NIC run
    at the same time, so the slower of the two sets the time.

        T = max( (q-1)/n S/local_bw + (q-1) a_l,  (n-q)/n S/remote_bw + (n-q) a_r )

    q = n is all_to_all_s on NVLink; q = 1 is all_to_all_s on the NIC.
    """
    _check_members("n", n, 0)
    _check_members("q", q, 1)
    _require(q <= max(n, 1), f"q ({q}) must not exceed n ({n})")
    _check_nonneg("nbytes", nbytes)
    _check_pos("local_bw", local_bw)
    _check_pos("remote_bw", remote_bw)
    if n <= 1:
        return 0.0
    local = (q - 1) / n * nbytes / local_bw + (q - 1) * local_alpha_s
    remote = (n - q) / n * nbytes / remote_bw + (n - q) * remote_alpha_s
    return max(local, remote)


def node_dedup_all_to_all_s(
    nodes: int,
    nvlink_bytes: float,
    nic_bytes: float,
    local_bw: float,
    remote_bw: float,
    remote_alpha_s: float = 0.0,
) -> float:
    """A deduplicated MoE dispatch (DeepEP's internode kernels, arXiv 2412.19437 section
    3.2.2): each sender puts `nic_bytes` on its NIC, one message to the GPU of its own local
    index on each of the other nodes - 1 nodes, and the receiving GPUs forward
    `nvlink_bytes` over NVLink, pipelined with the NIC transfer, so the slower sets the time:

        T = max( nvlink_bytes / local_bw,  nic_bytes / remote_bw + (nodes - 1) a_r )
    """
    _check_members("nodes", nodes, 1)
    _check_nonneg("nvlink_bytes", nvlink_bytes)
    _check_nonneg("nic_bytes", nic_bytes)
    _check_pos("local_bw", local_bw)
    _check_pos("remote_bw", remote_bw)
    remote = nic_bytes / remote_bw + (nodes - 1) * remote_alpha_s if nodes > 1 else 0.0
    return max(nvlink_bytes / local_bw, remote)


def ring_attention_kv_s(
    cp: int, chunk_bytes: float, bandwidth_Bps: float, alpha_s: float = 0.0
) -> float:
    """Ring attention's KV exchange of one forward pass of one layer: cp-1 steps, each
    passing the rank's K and V chunk (`chunk_bytes`) to the next rank while it computes
    attention on the chunk it holds (Liu et al., arXiv 2310.01889; Megatron-Core / Transformer
    Engine context parallelism): (cp-1) (alpha + chunk/bw). The caller overlaps it with the
    attention core; the backward pass sends KV and its gradient, twice the bytes.
    """
    _check_collective(cp, chunk_bytes, bandwidth_Bps, alpha_s)
    if cp <= 1:
        return 0.0
    return (cp - 1) * (alpha_s + chunk_bytes / bandwidth_Bps)


# --------------------------------------------------------------------------- OptCC model
# optcc.md "The model to implement" (bandwidth-only, full duplex), after arXiv 2606.01680:
# p participants, n bytes each, healthy bandwidth B = `bw` per direction, one straggler at
# B/l. Latency is not part of this model; callers add it via ring_allreduce_s's alpha term.


def _check_failure(p: int, nbytes: float, bw: float, l: float) -> None:  # noqa: E741
    _check_members("p", p, 2)
    _check_nonneg("nbytes", nbytes)
    _check_pos("bw", bw)
    _require(
        math.isfinite(l) and l >= 1,
        f"l (straggler slowdown, straggler bandwidth = bw/l) must be finite and >= 1, got {l!r}",
    )


def ring_fault_free_s(p: int, nbytes: float, bw: float) -> float:
    """Fault-free ring optimum (bandwidth term): T_ring = 2(p-1)/p * n/B.

    The reference every failure overhead is measured against (arXiv 2606.01680 compares
    OptCC and R2CCL to NCCL's fault-free ring time).
    """
    _check_members("p", p, 1)
    return ring_allreduce_s(p, nbytes, bw, 0.0)


def ring_degraded_s(p: int, nbytes: float, bw: float, l: float) -> float:  # noqa: E741
    """Ring with one straggler at B/l: T = l * T_ring.

    In a ring every chunk crosses the straggler's link in lock-step, so the whole
    collective runs at the straggler's bandwidth (arXiv 2606.01680, introduction).
    """
    _check_failure(p, nbytes, bw, l)
    return l * ring_fault_free_s(p, nbytes, bw)


def allreduce_lower_bound_s(p: int, nbytes: float, bw: float, l: float) -> float:  # noqa: E741
    """Lower bound on all-reduce time with one straggler at B/l (arXiv 2606.01680).

        T_LB = (n/B) * max( l, 2(p-1) l / ((p-1) l + 1) )

    RECONSTRUCTED, not copied: the paper's theorem text was not available (optcc.md); this
    form is rebuilt from the paper's stated properties and is tested against them, not
    against a number. Terms:
    - l: the straggler's cut -- it must send n bytes and receive n bytes at B/l;
    - 2(p-1)l/((p-1)l+1): aggregate capacity -- p members each send 2(p-1)/p*n, i.e.
      2(p-1)n in total, over a combined send bandwidth of (p-1)B + B/l.
    Properties: l=1 gives T_ring; <= l*T_ring; at l=2 the overhead is p/(p-1) = 1+O(1/p);
    p=2 gives l*T_ring; for l>2 the overhead tends to l/2 and no longer vanishes with p.
    Keep this the single place the bound lives.
    """
    _check_failure(p, nbytes, bw, l)
    cut = l
    capacity = 2 * (p - 1) * l / ((p - 1) * l + 1)
    return nbytes / bw * max(cut, capacity)


def optcc_s(p: int, nbytes: float, bw: float, l: float, eps: float) -> float:  # noqa: E741
    """OptCC's achieved time as a cost: T_LB * (1 + eps).

    OptCC (arXiv 2606.01680) is a four-stage pipelined all-reduce that approaches the bound;
    `eps` is its gap (a k-segment pipelined schedule gives eps = 1/k; the paper's SimAI
    results, 2-6% over fault-free ring at up to 50% loss, correspond to a few percent).
    """
    _require(math.isfinite(eps) and eps >= 0, f"eps must be finite and >= 0, got {eps!r}")
    return allreduce_lower_bound_s(p, nbytes, bw, l) * (1 + eps)


def r2ccl_s(p: int, nbytes: float, bw: float, lost_fraction: float, chunks: int = 4) -> float:
    """R2CCL-style baseline: T_ring + X n / ((1-X) B) * (K+1)/K.

    X = lost fraction of the straggler server's NICs, K = chunks. The lost share of the
    message is re-sent over the surviving (1-X) bandwidth, with (K+1)/K pipeline fill.
    optcc.md / arXiv 2606.01680: up to 57% overhead at 50% loss, vs 2-6% for OptCC.
    """
    _check_members("p", p, 2)
    _check_nonneg("nbytes", nbytes)
    _check_pos("bw", bw)
    _require(
        math.isfinite(lost_fraction) and 0 <= lost_fraction < 1,
        f"lost_fraction must be in [0, 1), got {lost_fraction!r}",
    )
    _check_members("chunks", chunks, 1)
    x = lost_fraction
    k = chunks
    return ring_fault_free_s(p, nbytes, bw) + x * nbytes / ((1 - x) * bw) * (k + 1) / k


def nic_loss_factor(nics_per_node: int, lost: int = 1) -> float:
    """Straggler slowdown l when a node loses `lost` of its NICs: nics / (nics - lost).

    NCCL reroutes over surviving NICs (PXN), so bandwidth falls in proportion; 8 NICs with
    one lost gives l = 8/7, a 12.5% bandwidth loss (arXiv 2606.01680, introduction).
    """
    _check_members("nics_per_node", nics_per_node, 1)
    _require(
        isinstance(lost, int) and not isinstance(lost, bool) and 0 <= lost < nics_per_node,
        f"lost must be an integer in [0, nics_per_node={nics_per_node}), got {lost!r}",
    )
    return nics_per_node / (nics_per_node - lost)
