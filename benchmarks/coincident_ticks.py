"""An experiment on the lockstep tick, not placer's model: per-message ticks from the
coincidences of the uncontended schedule, against the whole-job simulation.

placer's closed form (PerfModel.route_tick_s) charges every cross-site message of a hop
the bytes of all boundaries that cross it, as if they all sent at once. In 1F1B they do
in the warm-up and the drain, but not in the steady state, and with m <= 2 pp (the random
set) a boundary's micro-batches meet only some of the others'. Here each message's
transmit time is the larger of its NIC serialization and

    coincident: the bytes of the messages whose uncontended transmissions overlap its own
                on the hop (each chain type's 1F1B at NIC speed, shortest paths), over
                the route's capacity, the busiest hop of its path;
    mix a:      (1 - a) x coincident + a x the bytes of all messages of its kind on the
                hop per micro-batch over the capacity;

with the chain's shared FIFOs as placer has them (PerfModel.boundary_queues). The
harness first checks that, given placer's own per-boundary ticks, it reproduces the
evaluator's T_pipe on every plan. The simulated times come from a
`sim_vs_closed.py --dump` of the same seed with overlap off (written here if absent).

    .venv/bin/python benchmarks/coincident_ticks.py --seed 2 --random 1000 --dump /tmp/off.json

Results: benchmarks/README.md, "Per-message lockstep ticks (session 45)".
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from sim_cases import plan as make_plan  # noqa: E402
from sim_cases import problem as make_problem  # noqa: E402
from sim_vs_closed import draw_plan, random_set  # noqa: E402

from placer.evaluate import config_of, evaluate  # noqa: E402
from placer.io import plan_from_data  # noqa: E402
from placer.network import route_key  # noqa: E402
from placer.perf.critical_path import _evaluate, critical_path  # noqa: E402
from placer.perf.step import PerfModel, _div, hops_of  # noqa: E402


def pipe_variants(prob, plan_data: dict, step, mixes: list[float]) -> dict[str, float]:
    """T_pipe of one plan under placer's tick ("placer": the evaluator's route ticks,
    re-timed by this harness), the coincident ticks and each mix. `step`: the evaluator's
    StepResult of the plan (its route ticks and route-average bounds)."""
    perf = PerfModel(prob)
    plan = plan_from_data(plan_data)
    cfg = config_of(prob, plan)
    assert cfg.virtual_stages == 1 and not cfg.dualpipev and not cfg.staggered
    groups = [(g.count, tuple(g.stage_sites)) for g in plan.replica_groups]
    waves = {link.key: link.waves for link in plan.links}
    cap = {key: perf.net.capacity_Bps(key, waves.get(key, 0), None) for key in perf.net.routes}
    msg, m = perf.message_bytes(cfg), cfg.num_micro_batches

    # every message's uncontended transmission window on each hop it travels
    on_hop: dict = defaultdict(list)  # hop -> [(start, nic, bytes, kind)]
    sent: dict = {}  # (chain, message) -> (hops, start, nic)
    times = {}
    for count, chain in groups:
        fwd, bwd, lat, nic = perf.chain_times_at(cfg, chain, None, None)
        times[chain] = (fwd, bwd, lat, nic)
        record: dict = {}
        _evaluate(fwd, bwd, lat, nic, m, 1, None, {}, record, None)
        bounds = perf.chain_boundaries(chain)
        for message, (j, start) in record.items():
            a, b, _ = bounds[j]
            if a == b:
                continue
            hops = []
            for use in perf.net.pair_paths(None, "pipeline", a, b) or ():
                path = hops_of(use.path, a)
                if message[0] == "B":  # gradients travel the path backwards
                    path = [(y, x) for x, y in path]
                for hop in path:
                    on_hop[hop].append((start, nic[j], count * use.share * msg, message[0]))
                    hops.append(hop)
            sent[(chain, message)] = (hops, start, nic[j])

    def busiest(hops, bytes_on) -> float:
        """The largest bytes_on(hop) over the hop's route capacity, over a message's hops."""
        return max((_div(bytes_on(h), cap.get(route_key(*h), 0.0)) for h in hops), default=0.0)

    def coincident(hops, start, width) -> float:
        return busiest(
            hops,
            lambda h: sum(
                by for s0, w0, by, _ in on_hop[h] if s0 < start + width and start < s0 + w0
            ),
        )

    def all_of_kind(hops, kind) -> float:
        return busiest(hops, lambda h: sum(by for *_x, by, k in on_hop[h] if k == kind) / m)

    tick_s, route_avg = step.route_tick_s, list(step.route_pp_s.values())

    def t_pipe(tx_of_chain) -> float:
        chain_t = []
        for _, chain in groups:
            fwd, bwd, lat, nic = times[chain]
            queues = perf.boundary_queues(chain)
            service, floor = perf.queue_service(cfg, chain, queues)
            path = critical_path(
                fwd, bwd, lat, nic, m, 1, queues, service, floor, tx_of_chain(chain, nic)
            )
            chain_t.append(path.makespan_s + perf.optimizer_step_s(cfg, chain))
        return max([*chain_t, *route_avg])

    def placer_tick(chain, nic):
        ticks = perf.boundary_ticks(chain, None, tick_s) if tick_s else [0.0] * len(nic)
        return lambda message, j: max(nic[j], ticks[j])

    def mixed(a: float):
        def tx_of_chain(chain, nic):
            def tx(message, j):
                if (chain, message) not in sent:
                    return nic[j]
                hops, start, width = sent[(chain, message)]
                co = coincident(hops, start, width)
                return max(nic[j], (1 - a) * co + a * max(co, all_of_kind(hops, message[0])))

            return tx

        return tx_of_chain

    out = {"placer": t_pipe(placer_tick)}
    for a in mixes:
        out["coincident" if a == 0 else f"mix {a:g}"] = t_pipe(mixed(a))
    return out


def counts(xs: list[float]) -> str:
    within = sum(abs(x) <= 0.02 for x in xs)
    above = sum(x > 0.02 for x in xs)
    return f"{within} / {above} / {len(xs) - within - above}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--random", type=int, default=1000)
    ap.add_argument(
        "--dump", type=Path, required=True, help="sim_vs_closed.py --dump (overlap off)"
    )
    ap.add_argument("--mix", type=float, nargs="*", default=[0.0, 0.25, 0.5])
    args = ap.parse_args()
    if not args.dump.exists():
        records: list = []
        random_set(args.random, args.seed, overlap=False, dump=records)
        args.dump.write_text(json.dumps(records))
    sim = json.loads(args.dump.read_text())
    assert len(sim) >= args.random and all(r["seed"] == args.seed for r in sim[: args.random])
    rng = random.Random(args.seed)
    rows = []
    same = 0
    for i in range(args.random):
        sites, routes, pp, m, tp, groups, links = draw_plan(rng)
        prob = make_problem(sites, routes, global_batch=m * sum(c for c, _ in groups))
        data = make_plan(tp, [8 // pp] * pp, groups, m, links)
        ev = evaluate(prob, data)
        var = pipe_variants(prob, data, ev.step, args.mix)
        same += abs(var["placer"] - ev.step.pipe_s) <= 1e-12 * ev.step.pipe_s
        rows.append((sim[i], ev, var))
    print(f"harness: placer's T_pipe reproduced on {same} of {len(rows)} plans")
    print()
    print(
        "| T_pipe rule | T_pipe within / above / below 2% "
        "| step within / above / below 2% | step min | step max |"
    )
    print("|---|---:|---:|---:|---:|")
    for name in rows[0][2]:
        pipe, step = [], []
        for r, ev, var in rows:
            pipe.append(var[name] / r["sim_pipe_s"] - 1)
            closed = ev.step_time_s - ev.step.pipe_s + var[name]  # the rest of the step kept
            step.append(closed / r["sim_s"] - 1)
        print(f"| {name} | {counts(pipe)} | {counts(step)} | {min(step):+.1%} | {max(step):+.1%} |")


if __name__ == "__main__":
    main()
