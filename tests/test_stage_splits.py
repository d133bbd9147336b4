"""Layers per stage as a decision (issue 12 item 2): the split is searched, on mixed GPUs
the slower GPU gets fewer layers, `optimal` covers every split an instance allows, and the
bound that covers splits left out of the enumeration is valid.

Oracles: exhaustive search over every split, each solved by the brute-force backend with
the instance restricted to that one split (so the minimum over splits is taken here, not
by the code under test); the 1F1B simulator; brute-force min-max over compositions.
"""

from __future__ import annotations

import random

import pytest
import solver_cases as sc

from placer.errors import InputError
from placer.io import problem_from_data
from placer.optimize import splits
from placer.optimize.driver import solve
from placer.optimize.space import enumerate_configs
from placer.perf.pipeline import one_f_one_b_time, simulate_1f1b

pytestmark = pytest.mark.filterwarnings("ignore:Constructing LpVariable:DeprecationWarning")


def _with_splits(inst: dict, listed: list[list[int]] | str) -> dict:
    out = {**inst, "job": {**inst["job"]}}
    out["job"]["parallelism"] = {**inst["job"]["parallelism"], "stage_layers": listed}
    return out


def _best_over_splits(inst: dict, layers: int, pp: int) -> tuple[float, tuple[int, ...]]:
    """Minimum over every composition of the brute-force optimum with that split alone."""
    best = None
    for split in splits.compositions(layers, pp):
        try:
            res = solve(problem_from_data(_with_splits(inst, [list(split)])), backend="brute")
        except Exception:  # a split with no feasible plan
            continue
        if best is None or res.objective < best[0]:
            best = (res.objective, split)
    assert best is not None
    return best


def test_issue_case_mixed_a100_h100() -> None:
    """Two sites, A100 and H100, a 4-layer model (issue 12): the even split is beaten, and
    every backend now finds the exhaustive optimum with the A100 stage holding 1 layer."""
    inst = sc.mixed_gpu_pair("issue-12")
    best, split = _best_over_splits(inst, 4, 2)
    even = solve(problem_from_data(_with_splits(inst, [[2, 2]])), backend="brute").objective
    assert best < even * (1 - 0.02)  # the uneven split is worth > 2% here
    problem = problem_from_data(inst)
    for backend in ("brute", "cpsat", "milp"):
        res = solve(problem, backend=backend)
        assert res.status == "optimal" and res.gap == 0.0
        assert res.objective == pytest.approx(best, rel=1e-5, abs=1e-9), backend
        assert tuple(res.plan.stage_layers) == split == (1, 3)
        a100 = [k for k, s in enumerate(res.plan.replica_groups[0].stage_sites) if s == "s0"]
        assert [res.plan.stage_layers[k] for k in a100] == [1]  # the slower GPU


@pytest.mark.parametrize("case", sc.UNEVEN_SPLIT_CASES, ids=lambda c: c.id)
def test_uneven_cases_need_an_uneven_split(case: sc.Case) -> None:
    """The solver library's split cases: exhaustive search over splits agrees with the
    search space, and its optimum is uneven (the generator keeps cases that matter)."""
    par = case.instance["job"]["parallelism"]
    layers = sc.MODELS[case.instance["job"]["model"]]
    best, split = _best_over_splits(case.instance, layers, par["pp"][0])
    assert len(set(split)) > 1
    res = solve(problem_from_data(case.instance), backend="brute")
    assert res.objective == pytest.approx(best, rel=1e-12)


def test_listed_splits_restrict_the_search() -> None:
    inst = sc.mixed_gpu_pair("listed")
    res = solve(problem_from_data(_with_splits(inst, [[2, 2], [3, 1]])), backend="cpsat")
    assert res.status == "optimal" and list(res.plan.stage_layers) in ([2, 2], [3, 1])
    # pp defaults to the listed splits' lengths; other lengths are not searched
    inst2 = _with_splits(inst, [[1, 1, 2]])
    inst2["job"]["parallelism"] = {**inst2["job"]["parallelism"], "pp": None}
    inst2["job"]["gpus"] = None
    inst2["sites"] = [{**s, "gpus": 12} for s in inst2["sites"]]
    cfgs = enumerate_configs(problem_from_data(inst2))
    assert cfgs and {c.stage_layers for c in cfgs} == {(1, 1, 2)}


def test_listed_split_must_sum_to_the_layers() -> None:
    with pytest.raises(
        InputError, match=r"job\.parallelism\.stage_layers\[0\]: \[1, 2\] sums to 3"
    ):
        problem_from_data(_with_splits(sc.mixed_gpu_pair("bad"), [[1, 2]]))
    with pytest.raises(InputError, match="at least one layer"):
        problem_from_data(_with_splits(sc.mixed_gpu_pair("bad"), [[0, 4]]))


def test_all_splits_enumerated_when_few() -> None:
    inst = sc.mixed_gpu_pair("few", model="tiny-8l")
    cfgs = enumerate_configs(problem_from_data(inst))
    assert sorted(c.stage_layers for c in cfgs) == splits.compositions(8, 2)


def test_min_max_split_against_exhaustive_search() -> None:
    rng = random.Random(12)
    for _ in range(200):
        pp = rng.randint(1, 4)
        layers = rng.randint(pp, 9)
        lines = [(rng.uniform(0, 2), rng.uniform(0.1, 3)) for _ in range(pp)]
        caps = [rng.randint(1, layers) for _ in range(pp)]
        got = splits.min_max_split(lines, caps, layers)
        ok = [
            s
            for s in splits.compositions(layers, pp)
            if all(n <= c for n, c in zip(s, caps, strict=True))
        ]
        if not ok:
            assert got is None
            continue

        def value(s: tuple[int, ...], lines: list = lines) -> float:
            return max(a + b * n for (a, b), n in zip(lines, s, strict=True))

        assert got is not None and all(n <= c for n, c in zip(got, caps, strict=True))
        assert value(got) == pytest.approx(min(value(s) for s in ok), rel=1e-12)


def test_1f1b_bound_of_the_rest_holds() -> None:
    """rest_lower_bound_s relies on 1F1B >= max_k sum_{j<k} (c_j + 2 d_j) + m c_k."""
    rng = random.Random(7)
    for _ in range(300):
        p, m = rng.randint(1, 6), rng.randint(1, 10)
        f = [rng.uniform(0.1, 2) for _ in range(p)]
        b = [rng.uniform(0.1, 4) for _ in range(p)]
        lat = [rng.uniform(0, 1) for _ in range(p - 1)]
        tx = [rng.uniform(0, 1) for _ in range(p - 1)]
        c = [x + y for x, y in zip(f, b, strict=True)]
        d = [x + y for x, y in zip(lat, tx, strict=True)]
        bound = max(sum(c[j] + 2 * d[j] for j in range(k)) + m * c[k] for k in range(p))
        assert simulate_1f1b(f, b, lat, tx, m).makespan_s >= bound * (1 - 1e-12)
        assert one_f_one_b_time(f, b, lat, tx, m) >= bound * (1 - 1e-12)


def _large(name: str) -> dict:
    """tiny-8l, pp 4 (35 splits) over an A100 and an H100 site, small enough for brute force
    over every split one by one."""
    inst = sc.mixed_gpu_pair(name, model="tiny-8l", site_gpus=(8, 8))
    inst["job"]["gpus"] = 16
    inst["job"]["parallelism"] = {"tp": [4], "pp": [4], "dp": [1], "micro_batch": [1]}
    return inst


def test_generated_candidates_and_the_bound_of_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """With enumeration capped below the 35 splits, the generated candidates (even split,
    min-max per GPU-type pattern) plus the bound of the rest: the bound is below every split
    left out, and the status is `optimal` only when the plan is the exhaustive optimum."""
    inst = _large("rest")
    best, _ = _best_over_splits(inst, 8, 4)
    monkeypatch.setattr(splits, "MAX_ENUMERATED_SPLITS", 4)
    # the default candidate set is the generated splits: optimal over them, and it says so
    res = solve(problem_from_data(inst), backend="cpsat")
    assert res.plan.solver.splits == "candidates" and res.status == "optimal"
    assert res.objective >= best * (1 - 1e-9)
    inst = _with_splits(inst, "all")
    problem = problem_from_data(inst)
    cfgs = enumerate_configs(problem)
    searched = {c.stage_layers for c in cfgs}
    assert (2, 2, 2, 2) in searched and len(searched) < 35
    from placer.optimize.driver import split_gpus
    from placer.perf.step import PerfModel

    perf = PerfModel(problem)
    bound = splits.rest_lower_bound_s(problem, perf, cfgs[0], split_gpus(problem, cfgs[0]))
    for split in splits.compositions(8, 4):
        if split in searched:
            continue
        try:
            v = solve(problem_from_data(_with_splits(inst, [list(split)])), backend="brute")
        except Exception:
            continue
        assert bound <= v.objective
    for backend in ("brute", "cpsat", "milp"):
        res = solve(problem, backend=backend)
        assert res.plan.solver.splits == "all"
        assert res.bound <= best * (1 + 1e-9)  # the reported bound is a bound of the full space
        if res.status == "optimal":
            assert res.objective == pytest.approx(best, rel=1e-5)
        else:
            assert res.status == "feasible" and res.gap > 0


def test_plan_says_which_splits_were_searched() -> None:
    inst = sc.mixed_gpu_pair("which")
    got = {}
    for listed in (None, "even", [[3, 1]], "all"):
        res = solve(problem_from_data(_with_splits(inst, listed)), backend="cpsat")
        got[str(listed)] = (res.plan.solver.splits, tuple(res.plan.stage_layers), res.status)
    assert got == {
        "None": ("all", (1, 3), "optimal"),
        "even": ("even", (2, 2), "optimal"),
        "[[3, 1]]": ("listed", (3, 1), "optimal"),
        "all": ("all", (1, 3), "optimal"),
    }


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_stage_time_and_memory_are_affine_in_layers(recompute: str) -> None:
    """The candidate generator reads stage time and memory as lines through 1 and 2 layers;
    the performance model must give the same at any layer count (else min-max is off)."""
    from dataclasses import replace

    from placer.generate import random_instance
    from placer.perf.flops import config_stage_memory_bytes
    from placer.perf.step import PerfModel

    # a 2T model in 16 stages on B200s: memory binds on the first stages (1F1B in-flight)
    inst = random_instance(2, 16_384, seed=1, max_sites_per_replica=2, time_limit_s=60)
    inst["job"]["recompute"] = recompute
    inst["sites"][1]["gpu"] = "h100-sxm"
    problem = problem_from_data(inst)
    perf = PerfModel(problem)
    cfg = next(c for c in enumerate_configs(problem) if c.pp == 16 and c.dp == 8)
    binding = 0
    for gpu in ("b200", "h100-sxm"):
        lines = splits.stage_lines(perf, cfg, gpu)
        caps = splits.memory_caps(problem, cfg, gpu)
        for n in (3, 7, 11):
            times = perf.stage_times(replace(cfg, stage_layers=(n,) * cfg.pp), gpu)
            for (a, b), t in zip(lines, times, strict=True):
                assert a + b * n == pytest.approx(t.fwd + t.bwd, rel=1e-12)
        cap_bytes = (problem.catalog.gpus[gpu].hbm_gb - problem.catalog.memory.reserve_gb) * 1e9
        for k, c in enumerate(caps):
            at = lambda n, k=k: config_stage_memory_bytes(  # noqa: E731
                problem.model, replace(cfg, stage_layers=(n,) * cfg.pp), k
            )["total"]
            assert c == 0 or at(c) <= cap_bytes
            assert c == problem.model.layers or at(c + 1) > cap_bytes
            binding += c < problem.model.layers
    assert binding  # the check above saw caps that bind


def test_interleaved_shapes_narrow_what_optimal_claims() -> None:
    """With v > 1 the search tries the even split only (one per (pp, v)), so a plan solved
    with interleaving offered may not claim `all`: every split a v = 1 plan can name was
    searched, but not every split a v = 2 plan can name."""
    inst = sc.mixed_gpu_pair("interleaved")
    inst["job"]["parallelism"] = {**inst["job"]["parallelism"], "virtual_stages": [1, 2]}
    cfgs = enumerate_configs(problem_from_data(inst))
    assert any(c.virtual_stages == 2 for c in cfgs)  # the v = 2 shapes are searched
    res = solve(problem_from_data(inst), backend="cpsat")
    assert res.plan.solver.splits == "even"


@pytest.mark.parametrize(
    "sources,claim",
    [
        ({"all"}, "all"),
        ({"all", "candidates"}, "candidates"),  # large shapes: candidates only
        ({"all", "even"}, "even"),  # v = 1 every split, v > 1 the even one
        ({"candidates", "even"}, "even"),
        ({"listed", "even"}, "even+listed"),  # neither covers the other
        ({"listed"}, "listed"),
        (set(), None),
    ],
)
def test_solver_splits_is_what_holds_for_every_shape(sources: set[str], claim: str) -> None:
    from placer.optimize.driver import splits_searched
    from placer.optimize.space import SpaceReport

    report = SpaceReport()
    report.split_sources.update(sources)
    assert splits_searched(report) == claim
