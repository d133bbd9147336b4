"""Transfers as fluid flows on capacitated links, with max-min fair sharing, on simpy.

A flow moves a number of bytes over a set of resources (a NIC direction, a route
direction): at any moment every flow has one rate, and the rates are the max-min fair
allocation of the resources' capacities (progressive filling: all unfrozen flows grow
together until a resource saturates, its flows freeze, repeat). Rates are recomputed at
every flow arrival and departure, for the flows that share a resource with the changed
one, transitively (the connected component: allocations in other components cannot
change). Between two such events rates are constant, so a flow's finish time is exact.

Latency is not a flow property: callers add a path's propagation delay after the bytes
are through (`Fabric.transfer` returns when the last byte has left the bottleneck).

Finish times wait in one heap with a single simpy timer at its earliest entry, not one
timer per flow per re-rate: a re-rate of a component of a few hundred flows made as many
simpy events, most of them stale by the next re-rate (three-sites-80-300-500km's optimum:
948k timer events for 3,351 re-rates; benchmarks/README.md, "The simulator's finish
timers").
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import simpy

__all__ = ["Fabric", "Link", "max_min_fair"]

_REL_EPS = 1e-12  # relative slack when deciding that a resource is saturated


def max_min_fair(
    flows: Mapping[Hashable, Sequence[Hashable]], capacity: Mapping[Hashable, float]
) -> dict[Hashable, float]:
    """Max-min fair rates of `flows` (flow -> the resources it crosses) on `capacity`
    (resource -> bytes/s) by progressive filling. A flow that crosses no resource gets an
    infinite rate. Exact up to floating-point rounding (each round saturates at least one
    resource, so at most len(capacity) rounds)."""
    rate: dict[Hashable, float] = {}
    free = {f for f, res in flows.items() if res}
    for f, res in flows.items():
        if not res:
            rate[f] = math.inf
    left = {r: float(capacity[r]) for f in free for r in flows[f]}
    users: dict[Hashable, set[Hashable]] = {r: set() for r in left}
    for f in free:
        for r in flows[f]:
            users[r].add(f)
            rate[f] = 0.0
    while free:
        # every unfrozen flow grows by the smallest fair increment any resource allows
        inc = min(left[r] / len(u) for r, u in users.items() if u)
        for f in free:
            rate[f] += inc
        saturated, tightest = [], None
        for r, u in users.items():
            if u:
                if tightest is None or left[r] / len(u) < left[tightest] / len(users[tightest]):
                    tightest = r
                left[r] -= inc * len(u)
                if left[r] <= _REL_EPS * capacity[r]:
                    saturated.append(r)
        if not saturated:  # rounding: the resource that set the increment is the one full
            saturated.append(tightest)
        frozen = set().union(*(users[r] for r in saturated))
        for f in frozen:
            for r in flows[f]:
                users[r].discard(f)
        free -= frozen
    return rate


@dataclass(eq=False)
class Link:
    """One direction of a capacitated resource, with the statistics of its use."""

    key: Hashable
    capacity_Bps: float
    flows: set[_Flow] = field(default_factory=set)
    load_Bps: float = 0.0  # sum of the current rates of its flows
    peak_Bps: float = 0.0
    bytes: float = 0.0  # carried so far
    _since: float = 0.0  # time of the last load change

    def _set_load(self, now: float, load: float) -> None:
        self.bytes += self.load_Bps * (now - self._since)
        self._since = now
        self.load_Bps = load
        self.peak_Bps = max(self.peak_Bps, load)


@dataclass(eq=False)
class _Flow:
    links: tuple[Link, ...]
    left: float  # bytes not yet sent at time `since`
    done: simpy.Event
    rate: float = 0.0
    since: float = 0.0
    generation: int = 0  # bumped at every re-rate: stale finish timers are ignored


class Fabric:
    """The flows of one simulation on a set of links."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.links: dict[Hashable, Link] = {}
        self.flows_started = 0
        self._dirty: set[Link] = set()
        self._pending = False
        # (finish time, order, flow, its generation then); stale entries skipped on pop
        self._finishes: list[tuple[float, int, _Flow, int]] = []
        self._order = itertools.count()
        self._timer_at = math.inf  # when the pending finish timer fires (inf: none)

    def add_link(self, key: Hashable, capacity_Bps: float) -> Link:
        if key in self.links:
            raise ValueError(f"link {key!r} defined twice")
        if not capacity_Bps > 0:
            raise ValueError(f"link {key!r} needs a positive capacity, got {capacity_Bps!r}")
        link = self.links[key] = Link(key, float(capacity_Bps))
        return link

    def transfer(self, nbytes: float, path: Iterable[Hashable]) -> simpy.Event:
        """An event that fires when `nbytes` have crossed every link of `path`."""
        links = tuple(dict.fromkeys(self.links[k] for k in path))
        done = self.env.event()
        if nbytes <= 0 or not links:
            done.succeed()
            return done
        flow = _Flow(links, float(nbytes), done, since=self.env.now)
        self.flows_started += 1
        for link in links:
            link.flows.add(flow)
        self._touch(links)
        return done

    # ------------------------------------------------------------------ internals

    def _touch(self, links: Iterable[Link]) -> None:
        """Re-rate the component of `links` once every event of this instant has run:
        flows that start or end at the same time are rated together (the allocation in
        between lasts zero seconds)."""
        self._dirty.update(links)
        if not self._pending:
            self._pending = True
            ev = self.env.event()
            ev.callbacks.append(self._flush)
            ev.succeed()

    def _component(self, seeds: Iterable[Link]) -> tuple[set[_Flow], set[Link]]:
        links, flows = set(seeds), set()
        todo = list(links)
        while todo:
            for f in todo.pop().flows:
                if f not in flows:
                    flows.add(f)
                    for link in f.links:
                        if link not in links:
                            links.add(link)
                            todo.append(link)
        return flows, links

    def _flush(self, _ev: simpy.Event) -> None:
        self._pending = False
        seeds, self._dirty = self._dirty, set()
        now = self.env.now
        flows, links = self._component(seeds)
        if len(flows) == 1:
            (f,) = flows
            rates = {f: min(link.capacity_Bps for link in f.links)}
        else:
            rates = max_min_fair(
                {f: f.links for f in flows}, {link: link.capacity_Bps for link in links}
            )
        for link in links:
            link._set_load(now, sum(rates[f] for f in link.flows))
        for f in flows:
            rate = rates[f]
            if rate == f.rate:
                continue  # same rate: its finish timer still holds
            f.left = max(0.0, f.left - f.rate * (now - f.since))  # bytes sent at the old rate
            f.since = now
            f.rate = rate
            f.generation += 1
            at = now + f.left / rate
            heapq.heappush(self._finishes, (at, next(self._order), f, f.generation))
        self._arm()

    def _arm(self) -> None:
        """Keep one timer at the earliest live finish time. A timer set for a later time
        stays scheduled (simpy cannot cancel it) and does nothing when it fires (_due)."""
        heap = self._finishes
        while heap and heap[0][3] != heap[0][2].generation:
            heapq.heappop(heap)  # re-rated or finished since: stale
        if not heap or heap[0][0] >= self._timer_at:
            return
        at = heap[0][0]
        self._timer_at = at
        timer = self.env.timeout(max(0.0, at - self.env.now))
        timer.callbacks.append(lambda _ev, at=at: self._due(at))

    def _due(self, at: float) -> None:
        """The timer set for `at`: finish every live flow due by then, in the order
        their finish times were set (one timer per flow did the same, by event id)."""
        if at != self._timer_at:
            return  # superseded by an earlier timer, which re-armed
        self._timer_at = math.inf
        heap = self._finishes
        while heap and heap[0][0] <= at:
            _, _, flow, generation = heapq.heappop(heap)
            if generation == flow.generation:
                self._finish(flow)
        self._arm()

    def _finish(self, flow: _Flow) -> None:
        flow.left = 0.0
        flow.rate = 0.0
        flow.generation += 1
        for link in flow.links:
            link.flows.discard(flow)
        self._touch(flow.links)
        flow.done.succeed()

    def close(self) -> None:
        """Bring every link's byte count up to the current time."""
        now = self.env.now
        for link in self.links.values():
            link._set_load(now, link.load_Bps)
