"""Where the closed form and the simulation part with job.overlap on: the random
multi-site plans of sim_vs_closed.py (same draws), each re-simulated with one piece of the
overlapped data-parallel sync switched off in the simulator (and, where the closed form
prices that piece, in the closed form too), so that the change of the step diff is that
piece's share of the gap.

    .venv/bin/python benchmarks/overlap_gap.py --random 200 --seed 1

Instrumentation, not a placer feature: the switches wrap the simulator's private sync
processes (placer.sim.job._Job) for this script only. Variants, cumulative down the table:

* `shared links -> private`: the sync flows get copies of the NIC and route links of
  their own (no sharing with the pipeline's messages).
* `one latency per chunk`: the buckets' collectives (gradient reduce and parameter
  gather) pay their hop and WAN latencies once per chunk (its last bucket) instead of
  every bucket.
* `param gather free`: ZeRO-1's parameter all-gather costs nothing in the simulation, and
  the closed form's gather pieces (the second half of PerfModel.dp_pieces) are dropped.
* `grad reduce free`: no sync at all (both sides: T_pipe alone).
* `tp overlap off` (from the base): job.overlap.tp_comm off, on both sides.

`diff` = (closed form - simulation) / simulation of the whole step (negative: the closed
form is optimistic). Numbers recorded in benchmarks/README.md. The table there was
measured before the closed form priced the per-bucket latency (PerfModel.dp_lat_repeats);
since then only the `base` row compares like with like: the `one latency per chunk` row
and those below it take the latency out of the simulation only, and show the closed
form's latency term against a simulation without it.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sim_cases import dp_sync_class  # noqa: E402
from sim_cases import plan as make_plan  # noqa: E402
from sim_cases import problem as make_problem  # noqa: E402
from sim_vs_closed import draw_plan  # noqa: E402

import placer.sim.job as simjob  # noqa: E402
from placer.evaluate import evaluate  # noqa: E402
from placer.io import plan_from_data, problem_from_data  # noqa: E402
from placer.perf import compute  # noqa: E402
from placer.perf.step import PerfModel  # noqa: E402
from placer.sim import simulate  # noqa: E402

_ORIG = {
    "fabric": simjob._Job._fabric,
    "allreduce": simjob._Job._allreduce,
    "stage_sync": simjob._Job._stage_sync,
    "stage_gather": simjob._Job._stage_gather,
}


def _draw(rng: random.Random):
    """benchmarks/sim_vs_closed.py's draw, in the same order, as a plan."""
    sites, routes, pp, m, tp, groups, links = draw_plan(rng)
    replicas = sum(c for c, _ in groups)
    return sites, routes, m, make_plan(tp, [8 // pp] * pp, groups, m, links), replicas


def _wrapped(gen, patch):
    """Run generator `gen` (a simpy process body) with `patch` active while it runs."""
    val = None
    while True:
        with patch():
            try:
                ev = gen.send(val)
            except StopIteration:
                return
        val = yield ev


@contextmanager
def _switches(private: bool = False, free_gather: bool = False, one_latency: bool = False):
    def fabric(self, env):
        fab = _ORIG["fabric"](self, env)
        if private:
            for key, link in list(fab.links.items()):
                fab.add_link(("dp", *key), link.capacity_Bps)
        return fab

    def allreduce(self, run, k, fraction, wan, intra, scatter=True, gather=True, pay_lat=True):
        fab, job = run.fabric, self
        transfer, paths, lat = fab.transfer, job.paths, job.intra_lat

        @contextmanager
        def patch():
            if private:
                fab.transfer = lambda nbytes, links: transfer(nbytes, [("dp", *x) for x in links])
            if not pay_lat:
                job.paths = lambda *a: [(s, ln, 0.0) for s, ln, _ in paths(*a)]
                job.intra_lat = 0.0
            try:
                yield
            finally:
                fab.transfer, job.intra_lat = transfer, lat
                if not pay_lat:
                    del job.paths

        gen = _ORIG["allreduce"](self, run, k, fraction, wan, intra, scatter, gather)
        yield from _wrapped(gen, patch)

    def stage_sync(self, run, k, ready, pieces, wan):
        if not one_latency:
            yield from _ORIG["stage_sync"](self, run, k, ready, pieces, wan)
            return
        env = run.env
        for i, piece in enumerate(pieces):
            yield env.all_of([ready[(r, k)][i] for r in range(len(self.chains))])
            last = i == len(pieces) - 1 or pieces[i + 1][0] != piece[0]
            yield from self._allreduce(
                run, k, piece[3], wan=wan, intra=True, gather=not self.cfg.zero1, pay_lat=last
            )
        run.sync_end[k] = env.now

    def stage_gather(self, run, k, done, pieces, wan):
        if free_gather:
            for ev in done:
                ev.succeed()
            yield run.env.timeout(0)
            return
        if not one_latency:
            yield from _ORIG["stage_gather"](self, run, k, done, pieces, wan)
            return
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1 or pieces[i + 1][0] != piece[0]
            yield from self._allreduce(
                run, k, piece[3], wan=wan, intra=True, scatter=False, pay_lat=last
            )
            done[i].succeed()

    simjob._Job._fabric = fabric
    simjob._Job._allreduce = allreduce
    simjob._Job._stage_sync = stage_sync
    simjob._Job._stage_gather = stage_gather
    try:
        yield
    finally:
        for name, fn in _ORIG.items():
            setattr(simjob._Job, f"_{name}", fn)


def _closed_parts(prob, p) -> tuple[float, float, float]:
    """The closed form's step, T_pipe and the exposed part of its gather pieces (the
    second half of PerfModel.dp_pieces under ZeRO-1, with their latency repeats)."""
    perf = PerfModel(prob)
    ev = evaluate(prob, plan_from_data(p), perf, check_resilience=False)
    st = ev.step
    sync = st.intra_s + st.wan_s
    lat = st.wan_s - max(st.route_dp_s.values(), default=0.0)  # the WAN phase's latency
    pieces, reps = perf.dp_pieces(ev.config), perf.dp_lat_repeats(ev.config)
    halves = perf._dp_halves(ev.config)  # the gather half is the second under ZeRO-1
    half = len(halves[0][0]) if len(halves) == 2 else len(pieces)
    gat = compute.dp_exposed_s(sync, pieces[half:], lat, reps[half:]) if half < len(pieces) else 0.0
    return ev.step_time_s, st.pipe_s, gat


def _no_tp_overlap(prob):
    data = prob.instance.model_dump(mode="json", exclude_none=True)
    data["job"]["overlap"]["tp_comm"] = False
    data["job"]["model"] = prob.model.model_dump(mode="json", exclude_none=True)
    return problem_from_data(data)


VARIANTS = (
    "base",
    "shared links -> private",
    "+ one latency per chunk",
    "+ param gather free",
    "+ grad reduce free (T_pipe)",
    "tp overlap off (from base)",
)


def run(n: int, seed: int) -> None:
    rng = random.Random(seed)
    rows: list[tuple[str, list[float]]] = []
    for _ in range(n):
        sites, routes, _m, p, replicas = _draw(rng)
        prob = make_problem(sites, routes, global_batch=_m * replicas, overlap=True)
        closed, c_pipe, c_gat = _closed_parts(prob, p)
        diffs = [simulate(prob, p).rel_diff]
        with _switches(private=True):
            sim = simulate(prob, p).step_time_s
        diffs.append((closed - sim) / sim)
        with _switches(private=True, one_latency=True):
            sim = simulate(prob, p).step_time_s
        diffs.append((closed - sim) / sim)
        with _switches(private=True, free_gather=True, one_latency=True):
            res = simulate(prob, p)
        diffs.append((closed - c_gat - res.step_time_s) / res.step_time_s)
        diffs.append((c_pipe - res.pipe_s) / res.pipe_s)
        diffs.append(simulate(_no_tp_overlap(prob), p).rel_diff)
        rows.append((dp_sync_class(prob, p), diffs))
    print(f"## Overlap-on gap by piece: {n} random plans (seed {seed}), step diff")
    print("median / min / max (within 2%)\n")
    classes = sorted({c for c, _ in rows})
    heads = [f"{c} ({sum(r[0] == c for r in rows)})" for c in classes]
    print("| variant | " + " | ".join(heads) + " |")
    print("|---|" + "---:|" * len(classes))
    for i, name in enumerate(VARIANTS):
        cells = []
        for c in classes:
            sel = [d[i] for cc, d in rows if cc == c]
            cells.append(
                f"{statistics.median(sel):+.1%} / {min(sel):+.1%} / {max(sel):+.1%}"
                f" ({sum(abs(x) <= 0.02 for x in sel)} in 2%)"
            )
        print(f"| {name} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--random", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    run(args.random, args.seed)


if __name__ == "__main__":
    main()
