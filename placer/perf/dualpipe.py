"""DualPipeV: the V-shaped bidirectional pipeline schedule (DeepSeek-V3's DualPipe cut in half).

Sources: DeepSeek's reference implementation (github.com/deepseek-ai/DualPipe,
``dualpipe/dualpipev.py``, ``DualPipeV.step``) and its README ("Cut-in-half" of DualPipe, Sea
AI Lab); PyTorch ships the same order as ``torch.distributed.pipelining.ScheduleDualPipeV``
(``_calculate_single_rank_operations``; torchtitan ``pipeline_parallel_schedule =
"DualPipeV"``), checked action by action against :func:`dualpipev_order` in the consumer tier
(consumers/test_dualpipev.py).

Layout: ``p`` pipeline ranks hold ``2 p`` model stages (chunks) in a V: rank ``r`` runs model
stage ``r`` (phase 0, going down the ranks) and model stage ``2 p - 1 - r`` (phase 1, coming
back up); rank 0 holds the first model stage (embedding) and the last (LM head, loss); the
turn ``p - 1 -> p`` stays on rank ``p - 1``. Each physical boundary ``j`` (ranks ``j``,
``j + 1``) carries two message streams per direction: up (``j -> j + 1``) the phase-0
activations and the phase-1 gradients, down the phase-1 activations and the phase-0
gradients. ``m >= 2 p`` micro-batches (``DualPipeV.step`` asserts ``num_chunks >= num_ranks
* 2``; torch: at least as many micro-batches as stages).

Rank ``r``'s order (``DualPipeV.step``, steps 1-8; ``F`` forward, ``B`` full backward, ``I``
backward for inputs, ``W`` backward for weights, ``F&B`` one micro-batch's forward overlapped
with another's backward; chunk 0 = phase 0):

1. ``2 (p - r - 1)`` x ``F0``
2. ``r + 1`` x (``F0``, ``F1``)
3. ``p - r - 1`` x (``I1``, ``W`` (FIFO), ``F1``)
4. ``m - 2 p + r + 1`` x (``F0&B1``, ``F1&B0``); rank ``p - 1``'s first pair not overlapped
   (``F0``, ``B1``)
5. ``p - r - 1`` x (``B1``, ``F1&B0``)
6. ``r + 1`` x (``B1``, ``B0``), the second half as ``I`` (zero bubble; where the half falls
   depends on the rank's parity)
7. ``p - r - 1`` x (``W``, ``I0``)
8. ``r + 1`` x ``W``

Bubble (DualPipe README table, "PP" = the ``2 p`` stages): ``(p - 1)(F&B + B - 3 W)`` per rank
for uniform chunk times, ``F&B`` the time of an overlapped pair; here ``F&B = F + B`` (the
overlap hides communication, placer prices that in the stage times: job.overlap.ep_comm),
so ``(p - 1)(F + 2 B - 3 W)`` over ``2 m (F + B)`` of work (tests/test_dualpipev.py checks
the evaluation below against it). Parameters per device: the rank's two chunks, the same
``1/p`` of the model as 1F1B on ``p`` ranks (DualPipe, not V, holds 2x). Activations: at
most ``2 p + 1`` chunk micro-batches (``PP + 1``), each half a 1F1B stage's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from placer.perf.critical_path import CriticalPath, _counts, _later, _Stamp

__all__ = ["Action", "dualpipev_order", "dualpipev_path", "dualpipev_peak_layers", "v_rank"]

# one action: (kind, micro-batch, model stage), kind in F, B (full backward), I, W
Action = tuple[str, int, int]
# one op of a rank: one action, or two overlapped ones (F&B: the forward, then the backward)
Op = tuple[Action, ...]


def v_rank(p: int, s: int) -> int:
    """The pipeline rank of model stage ``s`` in the V (``s < 2 p``)."""
    return s if s < p else 2 * p - 1 - s


def dualpipev_order(p: int, m: int, rank: int) -> list[Op]:
    """Rank ``rank``'s ops, DeepSeek's ``DualPipeV.step`` (module docstring), micro-batch
    indices counted per (model stage, kind) as torch's ScheduleDualPipeV does; ``W`` takes
    the oldest pending ``I`` (WeightGradStore's FIFO)."""
    if p < 1 or rank < 0 or rank >= p:
        raise ValueError(f"rank {rank} outside pp {p}")
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs at least 2 x pp micro-batches (pp={p}, m={m})")
    s0, s1 = rank, 2 * p - 1 - rank
    nxt: dict[tuple[str, int], int] = {}
    pending: list[tuple[int, int]] = []  # (micro-batch, stage) of I awaiting its W
    ops: list[Op] = []

    def act(kind: str, s: int) -> Action:
        key = ("F" if kind == "F" else "B", s)
        x = nxt.get(key, 0)
        nxt[key] = x + 1
        if kind == "I":
            pending.append((x, s))
        return (kind, x, s)

    def one(kind: str, s: int) -> None:
        ops.append((act(kind, s),))

    def pair(sf: int, sb: int) -> None:
        ops.append((act("F", sf), act("B", sb)))

    def weight() -> None:
        if pending:
            x, s = pending.pop(0)
            ops.append((("W", x, s),))

    for _ in range(2 * (p - rank - 1)):  # step 1
        one("F", s0)
    for _ in range(rank + 1):  # step 2
        one("F", s0)
        one("F", s1)
    for _ in range(p - rank - 1):  # step 3
        one("I", s1)
        weight()
        one("F", s1)
    for i in range(m - 2 * p + rank + 1):  # step 4
        if i == 0 and rank == p - 1:
            one("F", s0)  # "We don't overlap these two chunks to further reduce bubble size"
            one("B", s1)
        else:
            pair(s0, s1)
        pair(s1, s0)
    for _ in range(p - rank - 1):  # step 5
        one("B", s1)
        pair(s1, s0)
    zb = False
    for i in range(rank + 1):  # step 6
        if i == (rank + 1) // 2 and rank % 2 == 1:
            zb = True
        one("I" if zb else "B", s1)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            zb = True
        one("I" if zb else "B", s0)
    for _ in range(p - rank - 1):  # step 7
        weight()
        one("I" if zb else "B", s0)
    for _ in range(rank + 1):  # step 8
        weight()
    return ops


def dualpipev_peak_layers(p: int, m: int, rank: int, chunks: tuple[float, float]) -> float:
    """The most layers' worth of micro-batch activations rank ``rank`` holds at once:
    ``chunks`` = (layers, or activation bytes, of its phase-0 chunk and of its phase-1
    chunk). A forward adds its chunk's share, a full backward or a ``W`` frees it (``I``
    keeps what the weight gradient reads); in an F&B op the forward's activations exist
    before the backward frees its own. Equal chunks: ``2 p + 1`` chunk micro-batches on
    every rank for ``m >= 2 p`` (the README's PP + 1; tests/test_dualpipev.py)."""
    size = {rank: chunks[0], 2 * p - 1 - rank: chunks[1]}
    cur = peak = 0.0
    for op in dualpipev_order(p, m, rank):
        for kind, _x, s in op:
            if kind == "F":
                cur += size[s]
                peak = max(peak, cur)
            elif kind in ("B", "W"):
                cur -= size[s]
    return peak


def dualpipev_path(
    fwd: Sequence[float],
    bwd: Sequence[float],
    wgt: Sequence[float],
    latency: Sequence[float],
    transmit: Sequence[float],
    m: int,
) -> CriticalPath:
    """Makespan of one DualPipeV step and its longest path's boundary counts (as
    placer.perf.critical_path.critical_path, whose message model this shares: each direction
    of a boundary one FIFO served in the producer's op order, ``transmit`` then
    ``latency``).

    ``fwd`` / ``bwd`` / ``wgt``: per model stage (``2 p``, model order): forward, full
    backward, and the weight-gradient part of the backward (``I = bwd - wgt``);
    ``latency`` / ``transmit``: per physical boundary (``p - 1``). An F&B op takes
    ``fwd + bwd`` and starts when both inputs are there; its two outputs leave at its end,
    the forward's first (``DualPipeV._forward_backward_chunk``)."""
    n = len(fwd)
    if n < 2 or n % 2 or len(bwd) != n or len(wgt) != n:
        raise ValueError("fwd, bwd and wgt need 2 * pp entries each")
    p = n // 2
    if len(latency) != p - 1 or len(transmit) != p - 1:
        raise ValueError(f"latency and transmit need {p - 1} entries (pp={p})")
    for name, xs in (
        ("fwd", fwd),
        ("bwd", bwd),
        ("wgt", wgt),
        ("latency", latency),
        ("transmit", transmit),
    ):
        if any(not (math.isfinite(x) and x >= 0) for x in xs):
            raise ValueError(f"{name} must hold finite non-negative times")
    if any(w > b for w, b in zip(wgt, bwd, strict=True)):
        raise ValueError("wgt must not exceed bwd")
    nb = p - 1
    start0: _Stamp = (0.0, None)
    last = n - 1
    orders = [dualpipev_order(p, m, r) for r in range(p)]
    nxt = [0] * p
    free: list[_Stamp] = [start0] * p
    fifo: dict[tuple[int, int], _Stamp] = {}  # (boundary, +1 up / -1 down)
    arrived: dict[tuple[str, int, int], _Stamp] = {}  # ("F"|"B", micro-batch, stage)
    done_f: dict[tuple[int, int], _Stamp] = {}  # forward ends (the loss's backward reads)

    def ready(a: Action) -> _Stamp | None:
        kind, x, s = a
        if kind == "W":
            return start0
        if kind == "F":
            return start0 if s == 0 else arrived.get(("F", x, s))
        return done_f.get((x, s)) if s == last else arrived.get(("B", x, s))

    def send(kind: str, x: int, s: int, end: _Stamp) -> None:
        if kind == "F":
            if s == last:
                done_f[(x, s)] = end
                return
            dst = s + 1
        else:
            if s == 0:
                return
            dst = s - 1
        a, b = v_rank(p, s), v_rank(p, dst)
        key = ("F" if kind == "F" else "B", x, dst)
        if a == b:  # the turn of the V: same rank
            arrived[key] = end
            return
        j, d = min(a, b), (1 if b > a else -1)
        tx = _later(end, fifo.get((j, d), start0))
        out = (tx[0] + transmit[j], (tx[1], j))
        fifo[(j, d)] = out
        arrived[key] = (out[0] + latency[j], (out[1], nb + j))

    def duration(a: Action) -> float:
        kind, _x, s = a
        if kind == "F":
            return fwd[s]
        if kind == "B":
            return bwd[s]
        if kind == "I":
            return bwd[s] - wgt[s]
        return wgt[s]

    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(p):
            order = orders[r]
            while nxt[r] < len(order):
                op = order[nxt[r]]
                deps = [ready(a) for a in op]
                if any(d is None for d in deps):
                    break
                start = free[r]
                for d in deps:
                    start = _later(start, d)  # type: ignore[arg-type]
                end = (start[0] + sum(duration(a) for a in op), start[1])
                free[r] = end
                nxt[r] += 1
                remaining -= 1
                progressed = True
                for kind, x, s in op:
                    if kind == "F":
                        send("F", x, s, end)
                    elif kind in ("B", "I"):
                        send("B", x, s, end)
        if not progressed:  # pragma: no cover - the schedule is deadlock-free
            raise RuntimeError("DualPipeV schedule deadlocked")
    best = free[0]
    for stamp in free[1:]:
        best = _later(best, stamp)
    n, lc = _counts(best[1], nb)
    return CriticalPath(best[0], n, lc)
