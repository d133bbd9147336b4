"""Time of one step of the 1F1B pipeline schedule (PipeDream-flush, Megatron non-interleaved).

One replica is a chain of ``p`` stages that processes ``m`` micro-batches.  Stage ``k`` spends
``fwd[k]`` / ``bwd[k]`` seconds on the forward / backward of one micro-batch.  Boundary ``j``
(between stage ``j`` and ``j + 1``) is a full-duplex link: activations go ``j -> j+1``, gradients
``j+1 -> j``; each direction is a FIFO that serializes one message at a time for ``transmit[j]``
seconds and delivers it ``latency[j]`` seconds after it finished transmitting::

    tx_start = max(message ready, previous message of that direction done transmitting)
    arrival  = tx_start + transmit[j] + latency[j]

Stage ``k`` runs ``w_k = min(p - k - 1, m)`` warm-up forwards, then alternates one forward / one
backward, then drains its remaining backwards.  A stage computes one op at a time;
communication only delays compute through data dependencies.

This module gives

* :func:`simulate_1f1b`: exact ordered evaluation of that schedule (the reference);
* :func:`one_f_one_b_time`: the closed form (derivation below), a max over longest-path shapes
  of the schedule, equal to the simulator up to floating-point rounding for every input (any
  ``p >= 1``, ``m >= 1``, any non-negative times);
* :func:`steady_state_period`: the max-plus cycle mean (seconds per micro-batch as ``m -> oo``);
* :func:`bubble_fraction`: ``(p - 1) / (m + p - 1)``.

Derivation of the closed form
-----------------------------
Notation: ``f_k, b_k`` stage times, ``c_k = f_k + b_k``; for boundary ``j``: ``tau_j`` transmit,
``lam_j`` latency, ``d_j = tau_j + lam_j``.  ``F_k(x)`` / ``B_k(x)`` is the forward / backward of
micro-batch ``x`` on stage ``k``; ``w_k = min(p - 1 - k, m)``.

1. *Longest path.*  Every start time is a max over predecessors (the previous op of the stage, or
   a message arrival, itself a max over its producer and the previous message of its FIFO), and
   each edge adds a non-negative delay.  So the makespan is the weight of the longest path of a
   DAG whose nodes are the ops (weight = duration) and the FIFO slots (weight ``tau_j``):
   producer -> slot, slot ``x`` -> slot ``x + 1``, slot -> consumer (``+ lam_j``).

2. *Three regions.*  Stage ``k``'s steady pairs are slots ``n = 0 .. m - 1 - w_k``, pair ``n``
   being ``F_k(n + w_k), B_k(n)``.

   * Warm-up lattice ``F_k(x), x <= w_k``: moves right (stage order) and down
     (``F_k(x) -> F_{k+1}(x)``); a FIFO is one more row, between stage rows ``j`` and ``j + 1``,
     whose right moves weigh ``tau_j``.  Entered at ``F_0(0)``; left only from the anti-diagonal
     ``F_k(w_k)``, the first steady forward of a stage ``k = k_in``.
   * Cool-down lattice (``B_k(n)`` after stage ``k``'s last pair): right and up moves, entered only
     from the last steady backward of a stage ``k = k_out``, left at ``B_0(m - 1)``.
   * Steady grid, in between.

   A monotone lattice path visits each row it crosses once and spends its right moves on the
   heaviest row crossed (``W`` includes the entry forward, ``C`` excludes the exit backward)::

     W(k) = sum_{j<=k} f_j + sum_{j<k} d_j + (p-1-k) * max(f_0..f_k, tau_0..tau_{k-1})
     C(k) = sum_{j<k} (b_j + d_j)          + (p-1-k) * max(b_0..b_k, tau_0..tau_{k-1})

3. *Steady grid = zigzag.*  Inside the grid a path runs down the pipeline along forwards
   (``F_k(x) -> F_{k+1}(x)`` lands one slot later) and up along backwards (``B_{k+1}(n) ->
   B_k(n)``, same slot); turning from a backward to the stage's next forward costs one slot, and
   every message queued ahead on a FIFO ``j`` costs one slot and weighs ``tau_j``.  The path enters
   at ``k_in`` in slot 0 and must leave from ``k_out``'s last pair, slot ``m - p + k_out``, so the
   steady part is the heaviest zigzag
   ``k_in = u_1 <= v_1 >= u_2 <= v_2 >= ... <= v_T >= u_{T+1} = k_out`` with
   ``sum_t (v_t - u_t + 1) + (queued messages) = N = m - p + 1 + k_out`` slots, of weight
   (the entry forward ``f_{k_in}`` is already in ``W``)::

     Z = sum_t Fr(u_t, v_t) + sum_t Br(u_{t+1}, v_t) + sum(queued tau) - f_{k_in}
     Fr(u, v) = sum_{u..v} f + sum_{u<=j<v} d_j,    Br(u, v) = sum_{u..v} b + sum_{u<=j<v} d_j

   A zigzag is a simple path plus cycles: the round trip ``v -> u -> v`` earns
   ``G_uv = sum_{u..v} c + 2 sum_{u<=j<v} d_j`` for ``v - u + 1`` slots (``u..v`` hold that many
   micro-batches in flight: the max-plus cycles of 1F1B), a stage's own pair ``c_k`` and a FIFO
   ``tau_j`` one slot each.  The heaviest zigzag with exactly ``N`` slots is a max-plus matrix
   power over ``p`` states, evaluated slot by slot (``O(p m)``).

4. *Result*::

     T = max_{k_in, k_out} W(k_in) + Z_N(k_in -> k_out) + C(k_out)

   (for ``m < p`` only stages ``k >= p - m`` have steady pairs and can be ``k_in`` / ``k_out``).
   Uniform ``f, b``, no communication: staying on stage ``p - 1`` gives ``W + Z + C =
   p f + (m (f + b) - f) + (p - 1) b = (m + p - 1)(f + b)``, and no zigzag is heavier.  ``p = 1``:
   ``m (f + b)``.  For large ``m``, ``T`` grows by the maximum cycle mean ``Lambda`` per
   micro-batch (:func:`steady_state_period`).

Evaluation
----------
``W`` and ``C`` for all ``k`` come from running sums and maxima (``O(p)``).  ``Z`` is the slot
recursion above, run for ``t = 1 .. m`` with state ``fwd_q`` / ``bwd_q`` per stage: entries
``W(k_in)`` are injected in the first slots (shifted one stage deeper per slot through the FIFO
queue), and ``bwd_q[k_out] + C(k_out)`` is read in the slot of ``k_out``'s last steady backward.
Within a slot, forwards move down from the previous slot's state (elementwise) but the backward
run climbs in the same slot, ``bwd_q[r] = max(X[r], bwd_q[r + 1] + d_r + b_r)``; storing
``bwd_q[r] + P_r`` with ``P_r = sum_{j<r} (d_j + b_j)`` turns that climb into a cumulative
maximum.  So each slot is a fixed handful of numpy operations on length-``p`` vectors (``O(p m)``
arithmetic but only ``O(m)`` interpreter steps); below 16 stages a scalar loop over the same
recursion is faster.  The shifted coordinates only change rounding (agreement with the
original one-stage-at-a-time evaluation to ~1e-14 relative).  No jump over the periodic
regime: with ``m`` up to a few ``p``, entries occupy the first ``p`` slots and exits the last
``p``, so few slots evolve autonomously.

Why not a scalar formula: the textbook ``(first micro-batch round trip) + (m - 1) * Lambda`` is
off by more than 1% in half of the cases of the target domain (p 1..16, m p..8p, stage times
5-50 ms within 2x, latency <= 5 ms, transmit <= compute): with ``Lambda`` over all cycles it
over-estimates by up to 19% (the true fill/drain is not a full round trip when the bottleneck
is not the last stage, and the slots left after the transient come in whole cycles, so
``N * Lambda`` is not attained); with ``Lambda`` over suffix cycles only it also misses
sub-chain cycles (two slow stages across a slow link) and under-estimates by up to 25%.  The
integer slot budget is intrinsic, so the exact form keeps the max over zigzags.

Validated against :func:`simulate_1f1b` (``tests/test_pipeline.py`` and ~10^4 random cases: p
1..16, m 1..8p, stage, latency and transmit times from 0 to 20x one another): relative
difference below 1e-14, i.e. floating-point rounding.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

__all__ = [
    "Event",
    "SimResult",
    "bubble_fraction",
    "one_f_one_b_time",
    "one_f_one_b_order",
    "simulate_1f1b",
    "steady_state_period",
]


class Event(NamedTuple):
    """One compute op of the simulated schedule."""

    kind: str  # "F" or "B"
    micro_batch: int
    start: float
    end: float


@dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`simulate_1f1b`.

    ``events[k]`` lists stage ``k``'s ops in execution order.
    """

    makespan_s: float
    events: list[list[Event]]


def _positive_int(name: str, value: int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}") from None
    if n < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return n


def bubble_fraction(p: int, m: int) -> float:
    """Idle fraction of a uniform 1F1B step: ``(p - 1) / (m + p - 1)``."""
    p = _positive_int("p", p)
    m = _positive_int("m", m)
    return (p - 1) / (m + p - 1)


def one_f_one_b_order(p: int, m: int, k: int) -> list[tuple[str, int]]:
    """The op order of stage ``k`` under 1F1B: warm-up forwards, F/B pairs, drain backwards."""
    warm = min(p - k - 1, m)
    ops = [("F", x) for x in range(warm)]
    for n in range(m - warm):
        ops.append(("F", n + warm))
        ops.append(("B", n))
    ops.extend(("B", n) for n in range(m - warm, m))
    return ops


def _check_times(name: str, values: Sequence[float], n: int) -> list[float]:
    if len(values) != n:
        raise ValueError(f"{name} must have length {n}, got {len(values)}")
    out = []
    for v in values:
        x = float(v)
        if not math.isfinite(x) or x < 0.0:
            raise ValueError(f"{name} must hold finite non-negative times, got {v!r}")
        out.append(x)
    return out


def _validate(
    fwd: Sequence[float],
    bwd: Sequence[float],
    latency: Sequence[float],
    transmit: Sequence[float],
    m: int,
) -> tuple[list[float], list[float], list[float], list[float], int]:
    p = len(fwd)
    if p < 1:
        raise ValueError("need at least one stage")
    f = _check_times("fwd", fwd, p)
    b = _check_times("bwd", bwd, p)
    lat = _check_times("latency", latency, p - 1)
    tx = _check_times("transmit", transmit, p - 1)
    return f, b, lat, tx, _positive_int("m", m)


def simulate_1f1b(
    fwd: Sequence[float],
    bwd: Sequence[float],
    latency: Sequence[float],
    transmit: Sequence[float],
    m: int,
) -> SimResult:
    """Evaluate the 1F1B schedule exactly (ordered event evaluation, deterministic).

    Each stage executes its fixed 1F1B op order; an op starts when the stage is free and its
    input has arrived (the activation from stage ``k - 1`` for a forward, the gradient from
    stage ``k + 1`` for a backward, the stage's own forward for the last stage's backward).
    Messages leave in micro-batch order through a per-direction FIFO (see module docstring).
    """
    f, b, lat, tx, m = _validate(fwd, bwd, latency, transmit, m)
    p = len(f)
    orders = [one_f_one_b_order(p, m, k) for k in range(p)]
    nxt = [0] * p
    free = [0.0] * p
    fwd_link_free = [0.0] * (p - 1)  # when direction j -> j+1 can start the next message
    bwd_link_free = [0.0] * (p - 1)  # when direction j+1 -> j can start the next message
    act_arrival: dict[tuple[int, int], float] = {}  # (stage, micro-batch) -> arrival time
    grad_arrival: dict[tuple[int, int], float] = {}
    events: list[list[Event]] = [[] for _ in range(p)]
    remaining = 2 * m * p
    while remaining:
        progressed = False
        for k in range(p):
            order = orders[k]
            while nxt[k] < len(order):
                kind, x = order[nxt[k]]
                if kind == "F":
                    ready = 0.0 if k == 0 else act_arrival.get((k, x))
                else:
                    ready = free[k] if k == p - 1 else grad_arrival.get((k, x))
                if ready is None:
                    break
                start = max(ready, free[k])
                end = start + (f[k] if kind == "F" else b[k])
                free[k] = end
                events[k].append(Event(kind, x, start, end))
                nxt[k] += 1
                remaining -= 1
                progressed = True
                if kind == "F" and k < p - 1:
                    tx_start = max(end, fwd_link_free[k])
                    fwd_link_free[k] = tx_start + tx[k]
                    act_arrival[(k + 1, x)] = tx_start + tx[k] + lat[k]
                elif kind == "B" and k > 0:
                    tx_start = max(end, bwd_link_free[k - 1])
                    bwd_link_free[k - 1] = tx_start + tx[k - 1]
                    grad_arrival[(k - 1, x)] = tx_start + tx[k - 1] + lat[k - 1]
        if not progressed:  # pragma: no cover - 1F1B is deadlock-free
            raise RuntimeError("1F1B simulation deadlocked")
    makespan = max(stage[-1].end for stage in events)
    return SimResult(makespan_s=makespan, events=events)


_NUMPY_MIN_STAGES = 16  # below this many zigzag stages, the scalar loop beats numpy call overhead


def one_f_one_b_time(
    fwd: Sequence[float],
    bwd: Sequence[float],
    latency: Sequence[float],
    transmit: Sequence[float],
    m: int,
) -> float:
    """Closed-form makespan (seconds) of one 1F1B step; derivation in the module docstring.

    Equals ``(m + p - 1)(f + b)`` for uniform stages without communication; exact for every
    ``p >= 1``, ``m >= 1`` and non-negative times.  Cost ``O(p m)``: a handful of numpy
    operations per slot, vectorized over the stages (see "Evaluation" in the module docstring).
    """
    f, b, lat, tx, m = _validate(fwd, bwd, latency, transmit, m)
    p = len(f)
    s0 = max(0, p - m)  # stages below s0 have no steady pairs (m < p)
    d = [tx[j] + lat[j] for j in range(p - 1)]

    # Warm-up lattice W(k) (includes the entry forward) and cool-down lattice C(k) (excludes the
    # exit backward), k = s0..p-1: one op per row crossed, crossing delays, and p-1-k right moves
    # on the heaviest row (stage or FIFO) crossed (running maxima of f, b and tx).
    warm: list[float] = []
    cool: list[float] = []
    sf = sb = sd = 0.0
    mf = mb = -math.inf
    for k in range(p):
        fk, bk = f[k], b[k]
        sf += fk
        if fk > mf:
            mf = fk
        if bk > mb:
            mb = bk
        if k >= s0:
            warm.append(sf + sd + (p - 1 - k) * mf)
            cool.append(sb + sd + (p - 1 - k) * mb)
        sb += bk
        if k < p - 1:
            sd += d[k]
            if tx[k] > mf:
                mf = tx[k]
            if tx[k] > mb:
                mb = tx[k]

    if p - s0 < _NUMPY_MIN_STAGES:
        return _zigzag_scalar(f, b, tx, d, m, s0, warm, cool)
    return _zigzag_numpy(f, b, tx, d, m, s0, warm, cool)


def _zigzag_scalar(
    f: list[float],
    b: list[float],
    tx: list[float],
    d: list[float],
    m: int,
    s0: int,
    warm: list[float],
    cool: list[float],
) -> float:
    """``max_{k_in, k_out} W + Z + C`` by the slot recursion, one stage at a time (small ``p``).

    Slot ``t`` = steady pair index + 1; stages ``s0..p-1`` relabelled ``r = 0..q-1``:
      ``fd[r]``     best path ending with a forward on stage ``r`` in this slot,
      ``fwd_q[r]``  same, the activation possibly queued behind later ones on link ``r``,
      ``bwd_q[r]``  best path ending with a backward on stage ``r`` in this slot, possibly
                    followed by queued gradients on link ``r - 1``,
      ``entry[r]``  warm-up path entering stage ``r``, possibly through link ``r - 1``'s queue.
    """
    p = len(f)
    q = p - s0
    neg = -math.inf
    fs, bs = f[s0:], b[s0:]
    tx_down = tx[s0:] + [0.0]  # link r (r = q - 1: never read)
    tx_up = [tx[s - 1] if s > 0 else neg for s in range(s0, p)]  # link r - 1
    d_up = [d[s - 1] if s > 0 else 0.0 for s in range(s0, p)]
    entry = warm[:]
    fwd_q = [neg] * q
    bwd_q = [neg] * q
    fd = [neg] * q
    t_out = m - p + 1 + s0  # slot of the last steady backward of stage s0 (then s0 + 1, ...)
    best = neg
    for t in range(1, m + 1):
        if 1 < t <= q:  # warm-up entries shift one stage deeper per slot
            entry = [neg] + [entry[r - 1] + tx[s0 + r - 1] for r in range(1, q)]
        prev = neg  # fwd_q[r - 1] of the previous slot
        for r in range(q):
            v = bwd_q[r] + fs[r]  # turn after last slot's backward
            if t <= q and entry[r] > v:
                v = entry[r]
            w = prev + d_up[r] + fs[r]  # down from stage r - 1
            if w > v:
                v = w
            fd[r] = v
            prev = fwd_q[r]
            w = prev + tx_down[r]
            fwd_q[r] = v if v > w else w
        up = neg  # backward run climbing from deeper stages
        for r in range(q - 1, -1, -1):
            v = fd[r]
            if up > v:
                v = up
            v += bs[r]
            w = bwd_q[r] + tx_up[r]
            if w > v:
                v = w
            bwd_q[r] = v
            up = v + d_up[r]
        if t >= t_out:
            v = bwd_q[t - t_out] + cool[t - t_out]
            if v > best:
                best = v
    return best


def _zigzag_numpy(
    f: list[float],
    b: list[float],
    tx: list[float],
    d: list[float],
    m: int,
    s0: int,
    warm: list[float],
    cool: list[float],
) -> float:
    """Same recursion as :func:`_zigzag_scalar`, vectorized over the stages.

    Stages are stored deepest first, ``i = q - 1 - r``.  State ``z`` (length ``2q + 1``, all
    ``-oo`` before slot 1): ``z[i] = fwd_q``, ``z[q] = -oo`` (no stage above ``s0`` to come
    down from), ``z[q + 1 + i] = bwd_q + P`` with ``P[r] = sum_{s0 <= j < s0 + r} (d_j + b_j)``:
    in these shifted coordinates the upward backward run ``bwd_q[r] = max(X[r], bwd_q[r + 1] +
    d_r + b_r)`` is a cumulative maximum.  Per slot::

        fd[r]    = max(entry[r], bwd_q[r] + f_r, fwd_q[r - 1] + d_{r-1} + f_r)
        fwd_q[r] = max(fd[r], fwd_q[r] + tx_r)
        X[r]     = max(fd[r] + b_r, bwd_q[r] + tx_{r-1})
        bwd_q[r] = max_{r' >= r} X[r'] + sum_{r <= j < r'} (d_j + b_j)

    (stage indices relative to ``s0``; ``tx_{-1} = -oo`` when ``s0 = 0``).
    """
    p = len(f)
    q = p - s0
    neg = -math.inf
    prefix = [0.0] * q
    for r in range(1, q):
        prefix[r] = prefix[r - 1] + (d[s0 + r - 1] + b[s0 + r - 1])
    rev = range(q - 1, -1, -1)
    # z + to_fd: the inputs of fd (fwd_q of stage r - 1 sits at position i + 1).
    to_fd = np.array(
        [0.0]  # fwd_q of the deepest stage: never read
        + [d[s0 + r - 1] + f[s0 + r] for r in range(q - 1, 0, -1)]
        + [0.0]
        + [f[s0 + r] - prefix[r] for r in rev]
    )
    # z + queued: one more message queued ahead on the link.
    queued = np.array(
        [0.0]  # fwd_q of the deepest stage: never read
        + [tx[s0 + r] for r in range(q - 2, -1, -1)]
        + [0.0]
        + [tx[s0 + r - 1] if s0 + r > 0 else neg for r in rev]
    )
    b_shift = np.array([b[s0 + r] + prefix[r] for r in rev])
    # Warm-up entries: at slot t, stage r is entered by warm[r - t + 1] + tx over the links
    # r - t + 1 .. r - 1, i.e. (warm - S)[r - t + 1] + S[r], S[r] = tx over links s0 .. s0+r-1.
    # Deepest stage first, slot t reads the window t - 1 .. t - 2 + q of ``lagged``.
    tx_sum = [0.0] * q
    for r in range(1, q):
        tx_sum[r] = tx_sum[r - 1] + tx[s0 + r - 1]
    lagged = np.array([warm[r] - tx_sum[r] for r in rev] + [neg] * (q - 1))
    windows = np.ndarray((q, q), buffer=lagged, strides=(lagged.itemsize, lagged.itemsize))
    entries = windows + np.array(tx_sum[::-1])

    z = np.full(2 * q + 1, neg)
    z_bwd = z[q + 1 :]
    tmp_fd = np.empty(2 * q + 1)
    tmp_q = np.empty(2 * q + 1)
    fd_down, fd_turn = tmp_fd[1 : q + 1], tmp_fd[q + 1 :]
    new = np.full(2 * q + 1, neg)  # (fd, -oo, fd + b + P)
    fd, fd_b = new[:q], new[q + 1 :]
    t_out = m - p + 1 + s0  # slot of the last steady backward of stage s0 (then s0 + 1, ...)
    out = [0.0] * q  # bwd_q + P of stage r in the slot of its last steady backward
    add, maximum, accumulate = np.add, np.maximum, np.maximum.accumulate
    for t in range(1, m + 1):
        add(z, to_fd, out=tmp_fd)
        maximum(fd_down, fd_turn, out=fd)
        if t <= q:
            maximum(fd, entries[t - 1], out=fd)
        add(fd, b_shift, out=fd_b)
        add(z, queued, out=tmp_q)
        maximum(tmp_q, new, out=z)
        accumulate(z_bwd, out=z_bwd)
        if t >= t_out:
            r = t - t_out
            out[r] = z_bwd.item(q - 1 - r)
    return max(out[r] - prefix[r] + cool[r] for r in range(q))


def steady_state_period(
    fwd: Sequence[float],
    bwd: Sequence[float],
    latency: Sequence[float],
    transmit: Sequence[float],
) -> float:
    """Seconds per micro-batch of the 1F1B steady state (max-plus cycle mean).

    ``max( max_k (f_k + b_k), max_j transmit_j,
           max_{i<k} (sum_{i..k} (f + b) + 2 sum_{i<=j<k} (transmit_j + latency_j)) / (k-i+1) )``:
    every stage's own F/B pair, every FIFO direction, and every round trip over adjacent stages
    ``i..k``, which carries ``k - i + 1`` micro-batches (a FIFO's own bound is implied by the
    round trip across its boundary, which includes its transmit twice).  For large ``m``,
    ``one_f_one_b_time`` grows by this much per micro-batch on average: by ``s`` times it every
    ``s`` micro-batches, ``s`` the critical cycle's length.
    """
    f, b, lat, tx, _ = _validate(fwd, bwd, latency, transmit, 1)
    p = len(f)
    period = max([f[k] + b[k] for k in range(p)] + tx)
    for i in range(p):
        total = f[i] + b[i]
        for k in range(i + 1, p):
            total += f[k] + b[k] + 2.0 * (tx[k - 1] + lat[k - 1])
            period = max(period, total / (k - i + 1))
    return period
