"""The critical path of one pipeline step, with how often it crosses each boundary.

A replica chain's step (1F1B, or Megatron's interleaved 1F1B with ``v`` chunks per device)
is the longest path of a DAG whose nodes are the compute ops and the messages' FIFO slots
(placer.perf.pipeline's module docstring). Its weight is linear in every boundary's transmit
time ``tau_j`` and latency ``lam_j``::

    weight(path) = (compute on the path) + sum_j n_j tau_j + sum_j l_j lam_j

with ``n_j`` FIFO slots and ``l_j`` deliveries of boundary ``j`` on the path. The makespan is
the maximum over all paths, so for any other times ``tau', lam'``::

    makespan(tau', lam') >= makespan(tau, lam) + sum_j n_j (tau'_j - tau_j)
                                              + sum_j l_j (lam'_j - lam_j)

a supporting plane of a convex piecewise-linear function. This is what the formulations
need when a boundary's transmit time is a decision (lockstep contention, issue 11 item 1:
``tau_j`` grows with the replicas sharing a route at every tick, which depends on the
placement and the waves): every such plane is a valid row, and a plan whose chain times
meet all the planes of its own point is priced exactly (placer.optimize.contention).

Boundaries are physical: ``j`` joins pipeline ranks ``j`` and ``j + 1`` (``j < p - 1``); with
``v > 1`` boundary ``p - 1`` is the wrap from the last rank back to the first, which every
chunk boundary ``c p + p - 1 -> (c + 1) p`` crosses. Each direction of a boundary is one
FIFO (activations forward, gradients backward) served in the producer's op order, as in
placer.perf.pipeline.simulate_1f1b, which this module equals for ``v = 1`` (tests).

Two boundaries whose messages travel a common route direction (PerfModel.boundary_queues)
also share a FIFO for the route: a message holds it for the part of its transmit time
above its NIC serialization (``floor``), so ``hold = tau_j - floor_j`` stays linear in
``tau`` and a path through it keeps the plane form (``floor`` folds into the constant).
The shared FIFO serves its messages in a fixed order, the order their transmissions
start at the chain's uncontended times (service_order), not first come first served at
each point: with the order fixed the DAG is one for every ``tau``, so the makespan stays
a maximum over its paths, convex, and every plane a valid cut (an order that followed
``tau`` would make it a minimum over orders). The fixed order is a linear extension of
the schedule, so it never deadlocks, and where nothing waits on the route (every
``tau_j`` at its floor) it gives the unshared makespan (tests/test_shared_hops.py).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from placer.perf.pipeline import one_f_one_b_order

__all__ = ["CriticalPath", "critical_path", "interleaved_order", "service_order"]


@dataclass(frozen=True)
class CriticalPath:
    """The makespan and the boundary counts of one longest path."""

    makespan_s: float
    transmit_count: tuple[int, ...]  # n_j: FIFO slots of boundary j on the path
    latency_count: tuple[int, ...]  # l_j: deliveries over boundary j on the path

    def plane(
        self, transmit: Sequence[float], latency: Sequence[float]
    ) -> tuple[float, tuple[int, ...], tuple[int, ...]]:
        """(constant, n, l) of the supporting plane: makespan >= constant + n.tau + l.lam
        for every tau, lam (the path's compute weight is the constant)."""
        const = self.makespan_s
        const -= sum(n * t for n, t in zip(self.transmit_count, transmit, strict=True))
        const -= sum(n * t for n, t in zip(self.latency_count, latency, strict=True))
        return const, self.transmit_count, self.latency_count


def interleaved_order(p: int, m: int, v: int, rank: int) -> list[tuple[str, int, int]]:
    """The op order of pipeline rank ``rank``: (kind, micro-batch, model stage).

    ``v = 1``: 1F1B (placer.perf.pipeline.one_f_one_b_order), model stage = rank.
    ``v > 1``: Megatron-Core's interleaved schedule (forward_backward_pipelining_with_
    interleaving, micro-batch groups of ``p``; ``m`` must be a multiple of ``p``): chunk ``c``
    of rank ``r`` is model stage ``c p + r``; warm-up ``min(m v, (p - r - 1) 2 + (v - 1) p)``
    forwards, then one forward / one backward, then the remaining backwards; forward ``k``
    runs chunk ``(k mod p v) // p`` on micro-batch ``(k // p v) p + k mod p``, backward ``k``
    the mirror chunk ``v - 1 -`` that."""
    if v == 1:
        return [(kind, x, rank) for kind, x in one_f_one_b_order(p, m, rank)]
    if m % p:
        raise ValueError(f"interleaved 1F1B needs m a multiple of pp (pp={p}, m={m})")
    total = m * v
    warm = min(total, (p - rank - 1) * 2 + (v - 1) * p)

    def op(kind: str, k: int) -> tuple[str, int, int]:
        chunk = (k % (p * v)) // p
        if kind == "B":
            chunk = v - 1 - chunk
        return kind, (k // (p * v)) * p + k % p, chunk * p + rank

    ops = [op("F", k) for k in range(warm)]
    for i in range(total - warm):
        ops.append(op("F", warm + i))
        ops.append(op("B", i))
    ops.extend(op("B", k) for k in range(total - warm, total))
    return ops


@lru_cache(maxsize=64)
def _orders(p: int, m: int, v: int) -> tuple[tuple[tuple[str, int, int], ...], ...]:
    """Every rank's op order, built once per schedule shape: the contention planes evaluate
    one shape at many points (a tenth of a critical path's time went to rebuilding it)."""
    return tuple(tuple(interleaved_order(p, m, v, r)) for r in range(p))


# a time on the DAG and the last step of the path that attains it: (its parent's step, a
# code: j for a FIFO slot of boundary j, nb + j for a delivery over it), None at the
# start. The counts are read off the one longest path at the end (_counts): copying a
# count vector at every message took a third of the evaluation (contention planes,
# seed-1t-two-sites: 488 critical paths of 32 ranks)
_Step = tuple["_Step", int] | None
_Stamp = tuple[float, _Step]


def _later(a: _Stamp, b: _Stamp) -> _Stamp:
    return b if b[0] > a[0] else a


def _counts(step: _Step, nb: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    n = [0] * (2 * nb)
    while step is not None:
        step, code = step
        n[code] += 1
    return tuple(n[:nb]), tuple(n[nb:])


_Msg = tuple[str, int, int]  # (kind, micro-batch, model stage it is delivered to)
Queues = Sequence[tuple[int, int]]  # per physical boundary: (activations' FIFO, gradients')
Service = dict[int, tuple[_Msg, ...]]  # per shared FIFO, its messages in service order


def critical_path(
    fwd: Sequence[float],
    bwd: Sequence[float],
    latency: Sequence[float],
    transmit: Sequence[float],
    m: int,
    v: int = 1,
    queues: Queues | None = None,
    service: Service | None = None,
    floor: Sequence[float] | None = None,
    transmit_of: Callable[[_Msg, int], float] | None = None,
) -> CriticalPath:
    """Makespan of one step and its longest path's boundary counts.

    ``fwd`` / ``bwd``: seconds per micro-batch of each model stage (``v p`` of them, model
    stage ``s`` on rank ``s mod p``); ``latency`` / ``transmit``: per physical boundary
    (``p - 1`` of them for ``v = 1``, ``p`` with the wrap for ``v > 1``). Ordered evaluation
    of the schedule, ``O(v p m)`` ops.

    ``queues``: per physical boundary, the FIFO its activations and its gradients wait in
    (default: each direction of each boundary its own, served in its producer's op
    order). Where boundaries share a FIFO (a route direction their messages both travel,
    PerfModel.boundary_queues), ``service`` fixes its order (service_order): a fixed order
    keeps the makespan a longest path of one DAG, so its planes stay valid. A message
    holds its own direction's FIFO for its transmit time (its sender's NIC) and a shared
    one for the part of it above ``floor`` (its NIC serialization: what the route's
    tick adds, 0 where the NIC is the bottleneck), so the planes stay linear in
    ``transmit``.

    ``transmit_of(message, boundary)``: a transmit time per message instead of per
    boundary (the message is (kind, micro-batch, model stage it is delivered to)), for
    experiments with per-op lockstep ticks (benchmarks/coincident_ticks.py); placer's
    model passes None. A shared FIFO is then held for the message's own time above
    ``floor``."""
    hold = [t - f for t, f in zip(transmit, floor or transmit, strict=True)]
    return _evaluate(
        fwd, bwd, latency, transmit, m, v, queues, service or {}, None, hold, transmit_of
    )


def service_order(
    fwd: Sequence[float],
    bwd: Sequence[float],
    latency: Sequence[float],
    transmit: Sequence[float],
    m: int,
    v: int,
    queues: Queues,
) -> Service:
    """Each shared FIFO's messages in the order their transmissions start at these times
    (each boundary on its own FIFO), ties by the evaluation's own order: a linear
    extension of the schedule's DAG, so serving in it never deadlocks, and at these times
    sharing with no wait reproduces the unshared schedule. PerfModel takes it at a
    chain's uncontended times, one order per chain type."""
    sent: dict[int, list[tuple[float, int, _Msg]]] = {}
    record: dict[_Msg, tuple[int, float]] = {}
    _evaluate(fwd, bwd, latency, transmit, m, v, None, {}, record, None)
    users = Counter(q for pair in queues for q in pair)
    for seq, (msg, (j, start)) in enumerate(record.items()):
        q = queues[j][0 if msg[0] == "F" else 1]
        if users[q] > 1:
            sent.setdefault(q, []).append((start, seq, msg))
    return {q: tuple(msg for *_k, msg in sorted(xs)) for q, xs in sent.items()}


def _shape(
    fwd: Sequence[float],
    bwd: Sequence[float],
    latency: Sequence[float],
    transmit: Sequence[float],
    v: int,
) -> tuple[int, int]:
    if v < 1 or len(fwd) % v or len(fwd) != len(bwd) or not fwd:
        raise ValueError("fwd and bwd need v * pp entries each")
    p = len(fwd) // v
    nb = p - 1 if v == 1 else p
    if len(latency) != nb or len(transmit) != nb:
        raise ValueError(f"latency and transmit need {nb} entries (pp={p}, v={v})")
    for name, xs in (("fwd", fwd), ("bwd", bwd), ("latency", latency), ("transmit", transmit)):
        if any(not (math.isfinite(x) and x >= 0) for x in xs):
            raise ValueError(f"{name} must hold finite non-negative times")
    return p, nb


def _evaluate(
    fwd: Sequence[float],
    bwd: Sequence[float],
    latency: Sequence[float],
    transmit: Sequence[float],
    m: int,
    v: int,
    queues: Queues | None,
    service: Service,
    record: dict[_Msg, tuple[int, float]] | None,
    hold: Sequence[float] | None,
    transmit_of: Callable[[_Msg, int], float] | None = None,
) -> CriticalPath:
    p, nb = _shape(fwd, bwd, latency, transmit, v)
    last = v * p - 1
    zero: _Stamp = (0.0, None)
    orders = _orders(p, m, v)
    nxt = [0] * p
    free: list[_Stamp] = [zero] * p
    # FIFO of boundary j: forward (rank j -> j+1, wrap p-1 -> 0) and backward directions
    if queues is None:
        queues = [(j, nb + j) for j in range(nb)]
    if len(queues) != nb:
        raise ValueError(f"queues needs {nb} entries (pp={p}, v={v})")
    fifo: dict[int, _Stamp] = {q: zero for pair in queues for q in pair}
    own = [[zero] * nb, [zero] * nb]  # each direction's sender
    arrived: dict[_Msg, _Stamp] = {}
    # a shared FIFO's sends wait for their turn in `service`
    waiting: dict[int, dict[_Msg, tuple[int, _Stamp]]] = {q: {} for q in service}
    turn = {q: 0 for q in service}

    def transmit_shared(q: int, j: int, msg: _Msg, end: _Stamp) -> None:
        """A message on a shared FIFO q: its sender's direction, then the route's for the
        part above the NIC (`hold`)."""
        d = 0 if msg[0] == "F" else 1
        tx = _later(_later(end, own[d][j]), fifo[q])
        t_j = transmit[j] if transmit_of is None else transmit_of(msg, j)
        done = (tx[0] + t_j, (tx[1], j))
        own[d][j] = done
        assert hold is not None
        held = hold[j] if transmit_of is None else hold[j] + (t_j - transmit[j])
        fifo[q] = (tx[0] + max(0.0, held), done[1])
        arrived[msg] = (done[0] + latency[j], (done[1], nb + j))

    def send(q: int, j: int, msg: _Msg, end: _Stamp) -> None:
        if q not in service:  # its own FIFO (the hot path: no call, no _later)
            f = fifo[q]
            tx = f if f[0] > end[0] else end
            if record is not None:
                record[msg] = (j, tx[0])
            step = (tx[1], j)
            t = tx[0] + (transmit[j] if transmit_of is None else transmit_of(msg, j))
            fifo[q] = (t, step)
            arrived[msg] = (t + latency[j], (step, nb + j))
            return
        waiting[q][msg] = (j, end)
        order = service[q]
        while turn[q] < len(order) and order[turn[q]] in waiting[q]:
            jj, e = waiting[q].pop(order[turn[q]])
            transmit_shared(q, jj, order[turn[q]], e)
            turn[q] += 1

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            order = orders[r]
            while nxt[r] < len(order):
                kind, x, s = order[nxt[r]]
                if kind == "F":
                    ready = zero if s == 0 else arrived.get(("F", x, s))
                else:
                    ready = free[r] if s == last else arrived.get(("B", x, s))
                if ready is None:
                    break
                start = _later(free[r], ready)
                end = (start[0] + (fwd[s] if kind == "F" else bwd[s]), start[1])
                free[r] = end
                nxt[r] += 1
                remaining -= 1
                progressed = True
                if kind == "F" and s < last:
                    j = r  # rank r -> r + 1 (r = p - 1: the wrap, boundary p - 1)
                    send(queues[j][0], j, ("F", x, s + 1), end)
                elif kind == "B" and s > 0:
                    j = r - 1 if r > 0 else p - 1  # rank r -> r - 1 (r = 0: the wrap back)
                    send(queues[j][1], j, ("B", x, s - 1), end)
        if not progressed:  # pragma: no cover - a service order of the DAG cannot deadlock
            raise RuntimeError("pipeline schedule deadlocked")
    best = free[0]
    for stamp in free[1:]:
        best = _later(best, stamp)
    n, lc = _counts(best[1], nb)
    return CriticalPath(best[0], n, lc)
