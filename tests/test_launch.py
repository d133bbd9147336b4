"""Launch configurations: every check rebuilds the parallel groups from the framework's own
rank-order definition and the emitted files, independently of placer.outputs.launch.

- Megatron-LM: rank = tp_rank + tp * (dp_rank + dp * pp_rank) (order 'tp-cp-ep-dp-pp').
- torchtitan: numpy.arange(world).reshape(pp, dp_replicate, dp_shard, cp, tp) (row-major,
  rightmost fastest), the DeviceMesh dims ['pp', 'dp_replicate', 'dp_shard', 'cp', 'tp'].
- torchrun (static rendezvous): node rank i holds global ranks [sum of earlier nproc, + nproc).
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from placer.errors import InputError
from placer.evaluate import evaluate
from placer.io import load_instance, problem_from_data
from placer.outputs.export import FORMAT_NAMES, export, render
from placer.outputs.launch import build_layout, megatron_pipeline_args, parse_torchtitan_args
from placer.rules import site_gpus_per_host, site_gpus_per_node
from placer.schema import Plan

REPO = Path(__file__).resolve().parent.parent
INSTANCES = sorted((REPO / "instances").glob("*.yaml"))

# ----------------------------------------------------------------------------- hand-made cases


def _problem(sites: list[dict], routes: list[dict], global_batch: int, model: str = "tiny-8l"):
    return problem_from_data(
        {
            "name": "launch-test",
            "sites": sites,
            "routes": routes,
            "job": {"model": model, "global_batch": global_batch},
        }
    )


def _plan(
    tp: int,
    pp: int,
    groups: list[tuple[int, list[str]]],
    stage_layers: list[int],
    links: list[dict] | None = None,
    m: int = 2,
) -> Plan:
    dp = sum(c for c, _ in groups)
    return Plan.model_validate(
        {
            "parallelism": {"tp": tp, "pp": pp, "dp": dp, "micro_batch": 1, "num_micro_batches": m},
            "stage_layers": stage_layers,
            "replica_groups": [{"count": c, "stage_sites": s} for c, s in groups],
            "links": links or [],
        }
    )


H100 = {"gpu": "h100-sxm", "gpus": 64}
AB = [{"sites": ["A", "B"], "km": 100}]


def case_split_pipeline():
    """2 sites, one chain split A,A | B,B; tp=2 so a node holds 4 TP groups; tp*dp = 12."""
    prob = _problem([{"name": "A", **H100}, {"name": "B", **H100}], AB, global_batch=12)
    return prob, _plan(
        2, 4, [(6, ["A", "A", "B", "B"])], [2, 2, 2, 2], [{"sites": ["A", "B"], "waves": 1}]
    )


def case_mixed():
    """Replicas on A only, split A|B and B only: same-site runs straddle node boundaries, so
    some nodes host two node ranks."""
    prob = _problem([{"name": "A", **H100}, {"name": "B", **H100}], AB, global_batch=14)
    groups = [(2, ["B", "B"]), (3, ["A", "A"]), (2, ["A", "B"])]
    return prob, _plan(2, 2, groups, [5, 3], [{"sites": ["A", "B"], "waves": 1}])


def case_hetero_nodes():
    """A GB200 NVL72 site (72 GPUs per node) and an H100 site (8), tp=8, uneven end stages."""
    sites = [{"name": "G", "gpu": "gb200", "gpus": 144}, {"name": "H", **H100}]
    prob = _problem(sites, [{"sites": ["G", "H"], "km": 30}], global_batch=10)
    groups = [(3, ["G", "G", "G"]), (2, ["G", "H", "H"])]
    return prob, _plan(8, 3, groups, [2, 3, 3], [{"sites": ["G", "H"], "waves": 2}])


def case_aligned():
    """tp = gpus_per_node: one node rank per node; chains in both directions."""
    prob = _problem([{"name": "A", **H100}, {"name": "B", **H100}], AB, global_batch=8)
    return prob, _plan(
        8, 2, [(2, ["A", "B"]), (2, ["B", "A"])], [4, 4], [{"sites": ["A", "B"], "waves": 2}]
    )


CASES = {
    "split_pipeline": case_split_pipeline,
    "mixed": case_mixed,
    "hetero_nodes": case_hetero_nodes,
    "aligned": case_aligned,
}


# ----------------------------------------------------------------------------- independent checks


def plan_chains(plan: Plan) -> Counter:
    return Counter(tuple(g.stage_sites) for g in plan.replica_groups for _ in range(g.count))


def parse_hosts(text: str) -> list[tuple[str, int, list[int]]]:
    """(site, node, gpus) per node rank; line i (ignoring '#') must be node rank i."""
    out = []
    for ln in text.splitlines():
        if not ln.strip() or ln.startswith("#"):
            continue
        idx, site, node, host, gpus, nproc, first = ln.split()
        lo, _, hi = gpus.partition("-")
        g = list(range(int(lo), int(hi or lo) + 1))
        assert int(idx) == len(out) and len(g) == int(nproc) and host == f"{site}-node{node}"
        assert int(first) == sum(len(x[2]) for x in out), (
            "node ranks must hold consecutive global ranks"
        )
        out.append((site, int(node), g))
    return out


def rank_locations(host_text: str) -> list[tuple[str, int, int]]:
    """torchrun semantics: global rank -> (site, node, GPU)."""
    return [(site, node, gpu) for site, node, gpus in parse_hosts(host_text) for gpu in gpus]


def check_physical(problem, plan: Plan, loc: list[tuple[str, int, int]]) -> None:
    par = plan.parallelism
    assert len(loc) == par.tp * (par.cp or 1) * (par.ep or 1) * par.pp * par.dp
    assert len(set(loc)) == len(loc), "two ranks on one GPU"
    for site, node, gpu in loc:  # node = host, gpu = GPU within the host
        gph = site_gpus_per_host(problem, site)
        assert 0 <= gpu < gph
        assert 0 <= node < problem.instance.site(site).gpus // gph
    used = {}
    for site, node, _ in loc:  # the evaluator counts NVLink domains
        used.setdefault(site, set()).add(domain_of(problem, site, node))
    ev = evaluate(problem, plan)
    assert {s: len(n) for s, n in used.items()} == {s: n for s, n in ev.nodes_by_site.items() if n}


def domain_of(problem, site: str, host: int) -> int:
    return host * site_gpus_per_host(problem, site) // site_gpus_per_node(problem, site)


def same_domain(problem, locs) -> bool:
    return len({(s, domain_of(problem, s, n)) for s, n, _ in locs}) == 1


def check_megatron(problem, plan: Plan, files: dict[str, str]) -> None:
    args = files["megatron_args.sh"]
    tp = int(re.search(r"--tensor-model-parallel-size (\d+)", args).group(1))
    pp = int(re.search(r"--pipeline-model-parallel-size (\d+)", args).group(1))
    cp_m = re.search(r"--context-parallel-size (\d+)", args)
    ep_m = re.search(r"--expert-model-parallel-size (\d+)", args)
    cp, ep = int(cp_m.group(1)) if cp_m else 1, int(ep_m.group(1)) if ep_m else 1
    loc = rank_locations(files["megatron_hosts.txt"])
    world = len(loc)
    dp = world // (tp * cp * pp)  # Megatron's data-parallel size
    par = plan.parallelism
    assert (tp, cp, ep, pp, dp) == (par.tp, par.cp or 1, par.ep or 1, par.pp, par.dp * ep)
    check_physical(problem, plan, loc)

    def rank(t: int, d: int, p: int, c: int = 0) -> int:
        return t + tp * (c + cp * (d + dp * p))  # order tp-cp-ep-dp-pp

    chains = Counter()
    for d in range(dp):
        for p in range(pp):
            for c in range(cp):
                assert same_domain(problem, [loc[rank(t, d, p, c)] for t in range(tp)]), (
                    "TP group leaves its NVLink domain"
                )
        if d % ep == 0:  # plan replica d // ep: its ep data-parallel ranks share the chain
            chains[tuple(loc[rank(0, d, p)][0] for p in range(pp))] += 1
    assert chains == plan_chains(plan)
    # CP groups (stride tp) and EP groups (ep consecutive ranks, expert TP 1) inside one site
    for r in range(world):
        c = (r // tp) % cp
        cp_group = [r - c * tp + k * tp for k in range(cp)]
        assert len({loc[x][0] for x in cp_group}) == 1, "CP group crosses sites"
        ep_group = range(r - r % ep, r - r % ep + ep)
        assert len({loc[x][0] for x in ep_group}) == 1, "EP group crosses sites"
    # the layers per stage Megatron will build
    layers = int(re.search(r"--num-layers (\d+)", args).group(1))
    first = re.search(r"--decoder-first-pipeline-num-layers (\d+)", args)
    last = re.search(r"--decoder-last-pipeline-num-layers (\d+)", args)
    if "--pipeline-model-parallel-layout" not in args:
        f = int(first.group(1)) if first else None
        la = int(last.group(1)) if last else None
        rest, n = layers - (f or 0) - (la or 0), pp - (f is not None) - (la is not None)
        assert n == 0 or rest % n == 0
        split = (
            ([f] if f is not None else []) + [rest // n] * n + ([la] if la is not None else [])
            if n
            else [f, la]
        )
        assert split == list(plan.stage_layers)


def check_torchtitan(problem, plan: Plan, files: dict[str, str]) -> None:
    if "torchtitan.toml" in files:  # 0.2.x
        cfg = tomllib.loads(files["torchtitan.toml"])["parallelism"]
    else:  # 0.3: command-line overrides --section.key value...
        cfg = {}
        key = None
        for t in parse_torchtitan_args(files["torchtitan_args.sh"]):
            if t.startswith("--parallelism."):
                key = t.removeprefix("--parallelism.")
                cfg[key] = []
            elif t.startswith("--"):
                key = None
            elif key is not None:
                cfg[key].append(t)
        cfg = {
            k: (
                int(v[0])
                if len(v) == 1 and v[0].isdigit()
                else [x.split(",") for x in v]
                if k == "module_fqns_per_model_part"
                else v
            )
            for k, v in cfg.items()
        }
    rep, shard = cfg["data_parallel_replicate_degree"], cfg["data_parallel_shard_degree"]
    tp, pp = cfg["tensor_parallel_degree"], cfg["pipeline_parallel_degree"]
    cp, ep = cfg.get("context_parallel_degree", 1), cfg.get("expert_parallel_degree", 1)
    loc = rank_locations(files["torchtitan_hosts.txt"])
    assert rep * shard * cp * tp * pp == len(loc)
    check_physical(problem, plan, loc)
    mesh = np.arange(len(loc)).reshape(pp, rep, shard, cp, tp)
    chains = Counter()
    for r in range(rep):
        for s in range(shard):
            for p in range(pp):
                for c in range(cp):
                    assert same_domain(problem, [loc[x] for x in mesh[p, r, s, c, :]]), (
                        "TP group leaves its NVLink domain"
                    )
                assert len({loc[x][0] for x in mesh[p, r, s, :, :].flat}) == 1, "CP crosses sites"
            if (r * shard + s) % ep == 0:  # one plan replica per ep data-parallel ranks
                chains[tuple(loc[mesh[p, r, s, 0, 0]][0] for p in range(pp))] += 1
    assert chains == plan_chains(plan)
    for p in range(pp):
        for r in range(rep):
            for t in range(tp):
                assert len({loc[x][0] for x in mesh[p, r, :, 0, t]}) == 1, (
                    "FSDP shard group crosses sites"
                )
    if pp > 1:
        parts = cfg["module_fqns_per_model_part"]
        assert [sum(m.startswith("layers.") for m in part) for part in parts] == list(
            plan.stage_layers
        )
        assert parts[-1][-1] == ("output" if "torchtitan.toml" in files else "lm_head")


def check_rankmap(problem, plan: Plan, files: dict[str, str]) -> None:
    rows = list(csv.DictReader(io.StringIO(files["rankmap.csv"])))
    par = plan.parallelism
    cp, ep = par.cp or 1, par.ep or 1
    width = par.tp * cp * ep
    world = width * par.pp * par.dp
    assert [int(r["rank"]) for r in rows] == list(range(world))
    assert {(int(r["tp"]), int(r["cp"]), int(r["pp"]), int(r["dp"])) for r in rows} == {
        (t, c, p, d)
        for t in range(par.tp)
        for c in range(cp)
        for p in range(par.pp)
        for d in range(par.dp * ep)
    }
    loc = [(r["site"], int(r["node"]), int(r["local_gpu"])) for r in rows]
    check_physical(problem, plan, loc)
    expected = Counter()
    for g in plan.replica_groups:
        for s in g.stage_sites:
            expected[s] += g.count * width
    assert Counter(site for site, _, _ in loc) == expected
    by_group: dict[tuple[int, int, int], set] = {}  # TP groups
    for r in rows:
        by_group.setdefault((int(r["pp"]), int(r["dp"]), int(r["cp"])), set()).add(
            (r["site"], domain_of(problem, r["site"], int(r["node"])))
        )
    assert all(len(v) == 1 for v in by_group.values())
    chains = Counter(
        tuple(next(iter(by_group[(p, d, 0)]))[0] for p in range(par.pp))
        for d in range(0, par.dp * ep, ep)
    )
    assert chains == plan_chains(plan)
    data = json.loads(files["rankmap.json"])
    assert data["world_size"] == world and len(data["ranks"]) == world


def check_slurm_torchrun(files: dict[str, str], host_text: str) -> None:
    loc = rank_locations(host_text)
    hosts = files["slurm_hostfile.txt"].split()
    assert hosts == [f"{s}-node{n}" for s, n, _ in loc]
    seen: Counter = Counter()
    for (_site, _node, gpu), h in zip(loc, hosts, strict=True):
        assert seen[h] == gpu, "SLURM_LOCALID (order on the host) must be the planned GPU"
        seen[h] += 1
    sb = files["slurm.sbatch"]
    directives = [ln for ln in sb.splitlines() if ln.startswith("#SBATCH")]
    assert not any("distribution" in d for d in directives), (
        "arbitrary distribution belongs on the srun line only"
    )
    assert any(
        d.startswith(("#SBATCH --gpus-per-node=", "#SBATCH --exclusive")) for d in directives
    )
    srun = next(ln for ln in sb.splitlines() if ln.startswith("srun "))
    assert "--distribution=arbitrary" in srun and not re.search(r"\s(-N|--nodes)[ =]", srun)
    assert set(files["slurm_nodes.txt"].split()) == set(hosts)
    units = parse_hosts(host_text)
    found = {}
    for name, text in files.items():
        if not name.startswith("torchrun_"):
            continue
        host = None
        for ln in text.splitlines():
            m = re.match(r"  ([^\s()]+)\)$", ln)  # a case label: `  <host>)`
            if m:
                host = m.group(1)
            m = re.search(
                r"CUDA_VISIBLE_DEVICES=(\S+) .*--nnodes=(\d+) --node_rank=(\d+) --nproc_per_node=(\d+)",  # noqa: E501
                ln,
            )
            if m:
                gpus = [int(x) for x in m.group(1).split(",")]
                assert int(m.group(2)) == len(units) and int(m.group(4)) == len(gpus)
                found[int(m.group(3))] = (host, gpus)
    assert found == {i: (f"{s}-node{n}", g) for i, (s, n, g) in enumerate(units)}


def check_all(problem, plan: Plan, files: dict[str, str]) -> None:
    check_rankmap(problem, plan, files)
    check_megatron(problem, plan, files)
    check_torchtitan(problem, plan, files)
    check_slurm_torchrun(files, files["megatron_hosts.txt"])
    assert (
        files["megatron_hosts.txt"].split("# Line i")[1]
        == files["torchtitan_hosts.txt"].split("# Line i")[1]
    )


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", list(CASES))
def test_layouts_rebuild_the_plan(name):
    problem, plan = CASES[name]()
    files = render(problem, plan, "all")  # the hand-made plans are feasible: render checks
    check_all(problem, plan, files)


def _render_unchecked(problem, plan):
    from placer.outputs import launch

    lay = launch.build_layout(problem, plan)
    out: dict[str, str] = {}
    for fn in (
        launch.rankmap_files,
        launch.megatron_files,
        launch.torchtitan_files,
        launch.torchrun_files,
        launch.slurm_files,
    ):
        out.update(fn(lay))
    return out


def test_mixed_plan_shares_nodes_between_node_ranks():
    problem, plan = case_mixed()
    lay = build_layout(problem, plan)
    # hand count: replicas sorted by chain: 0-2 (A,A), 3-4 (A,B), 5-6 (B,B); TP group t = dp + 7 * pp.  # noqa: E501
    # A hosts t=0..4 (stage 0) and t=7..9 (stage 1), 4 per node: A0 = t0-3, A1 = t4 | t7-9.
    # B hosts t=5,6 (stage 0) and t=10..13 (stage 1): stage 1's four fill a node, B0 =
    # t10-13, and stage 0's remainder of 2 sits in one, B1 = t5-6 (each stage's members in
    # whole nodes plus one part-filled node, as PerfModel.node_fill prices; in rank order
    # B0 = t5-6 | t10-11 would split stage 1 over two half nodes)
    assert lay.nodes_by_site == {"A": 2, "B": 2}
    units = [(u.site, u.node, u.gpus) for u in lay.node_ranks]
    assert units == [
        ("A", 0, (0, 1, 2, 3, 4, 5, 6, 7)),
        ("A", 1, (0, 1)),
        ("B", 1, (0, 1, 2, 3)),
        ("A", 1, (2, 3, 4, 5, 6, 7)),
        ("B", 0, (0, 1, 2, 3, 4, 5, 6, 7)),
    ]


def test_aligned_plan_one_node_rank_per_node():
    problem, plan = case_aligned()
    lay = build_layout(problem, plan)
    assert len(lay.node_ranks) == sum(lay.nodes_by_site.values()) == 8
    assert all(u.nproc == 8 for u in lay.node_ranks)


@pytest.mark.parametrize(
    ("stages", "flags"),
    [
        ([4, 4], {}),
        ([3, 5], {"--decoder-first-pipeline-num-layers": "3"}),
        (
            [5, 6, 6, 6, 7],
            {"--decoder-first-pipeline-num-layers": "5", "--decoder-last-pipeline-num-layers": "7"},
        ),
        ([6, 6, 6, 5], {"--decoder-last-pipeline-num-layers": "5"}),
    ],
)
def test_megatron_uneven_ends(stages, flags):
    args, _ = megatron_pipeline_args(stages)
    assert dict(zip(args[::2], args[1::2], strict=True)) == flags


def test_megatron_uneven_middle_is_flagged():
    args, notes = megatron_pipeline_args([2, 3, 2, 1])
    assert args == ["--pipeline-model-parallel-layout", "Et*2|t*3|t*2|t*1,L"]
    assert any("middle stages are uneven" in n for n in notes)
    problem = _problem([{"name": "A", **H100}], [], global_batch=4)
    plan = _plan(2, 4, [(2, ["A"] * 4)], [2, 3, 2, 1])
    text = _render_unchecked(problem, plan)["megatron_args.sh"]
    assert "WARNING: the plan's middle stages are uneven" in text


def test_tp_larger_than_node_cannot_launch():
    problem = _problem(
        [{"name": "A", "gpu": "h100-sxm", "gpus": 64, "gpus_per_node": 4}], [], global_batch=4
    )
    plan = _plan(8, 1, [(2, ["A"])], [8])
    with pytest.raises(InputError, match="tp=8 does not fit in an NVLink domain of site 'A'"):
        build_layout(problem, plan)


def test_unknown_format_lists_formats(tmp_path):
    problem, plan = case_aligned()
    with pytest.raises(
        InputError, match="formats: bom, rankmap, megatron, torchtitan, torchrun, slurm, all"
    ):
        export(problem, plan, "yaml", tmp_path)
    assert not list(tmp_path.iterdir())


def test_infeasible_plan_is_input_error(tmp_path):
    problem, plan = case_aligned()
    bad = plan.model_copy(update={"stage_layers": [3, 4]})
    with pytest.raises(InputError, match="not feasible.*\n.*shape: stage_layers: sum to 7"):
        export(problem, bad, "bom", tmp_path)
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "placer.cli", "export", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    inst = d / "inst.yaml"
    inst.write_text(
        "name: cli-test\nsites:\n  - {name: A, gpu: h100-sxm, gpus: 64}\n  - {name: B, gpu: h100-sxm, gpus: 64}\nroutes:\n  - {sites: [A, B], km: 100}\njob: {model: tiny-8l, global_batch: 8}\n"  # noqa: E501
    )
    _, plan = case_aligned()
    good = d / "plan.json"
    good.write_text(plan.model_dump_json())
    bad = d / "bad.json"
    bad.write_text(plan.model_copy(update={"stage_layers": [3, 4]}).model_dump_json())
    return d, inst, good, bad


def test_cli_export_writes_files(cli_files):
    d, inst, good, _ = cli_files
    r = _cli(str(good), "--instance", str(inst), "--format", "all", "-o", str(d / "out"))
    assert r.returncode == 0, r.stderr
    assert (d / "out" / "bom.csv").is_file() and (d / "out" / "torchrun_A.sh").is_file()
    assert "wrote" in r.stdout


@pytest.mark.parametrize(
    ("which", "fmt", "message"),
    [
        ("missing", "bom", "file not found"),
        ("good", "yaml", "unknown format 'yaml'"),
        ("bad", "megatron", "not feasible"),
    ],
)
def test_cli_export_bad_input_exits_2(cli_files, which, fmt, message):
    d, inst, good, bad = cli_files
    plan = {"missing": d / "nope.json", "good": good, "bad": bad}[which]
    r = _cli(str(plan), "--instance", str(inst), "--format", fmt, "-o", str(d / f"out-{which}"))
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    assert not (d / f"out-{which}").exists()


# ----------------------------------------------------------------------------- shipped instances


def _shipped(path: Path):
    """The instance and its shipped plan (instances/plans/, kept feasible by
    test_shipped_plans; an optimizer's plan goes through the same checks in
    test_a_solved_plan_exports_every_format)."""
    problem = load_instance(path)
    plan = Plan.model_validate_json((path.parent / "plans" / f"{path.stem}.json").read_text())
    assert evaluate(problem, plan).feasible
    return problem, plan


@pytest.mark.parametrize("path", INSTANCES, ids=[p.stem for p in INSTANCES])
def test_shipped_instances_export_every_format(path, tmp_path):
    _check_every_format(*_shipped(path), tmp_path)


def test_a_solved_plan_exports_every_format(tmp_path):
    import placer

    problem = load_instance(REPO / "instances" / "two-campus-100km.yaml")
    _check_every_format(problem, placer.solve(problem, backend="cpsat", time_limit_s=60), tmp_path)


def _check_every_format(problem, plan, tmp_path):
    written = {}
    for fmt in FORMAT_NAMES:
        for p in export(problem, plan, fmt, tmp_path / fmt):
            written.setdefault(fmt, {})[p.name] = p.read_text()
    assert set(written["all"]) == {
        name for fmt in FORMAT_NAMES if fmt != "all" for name in written[fmt]
    }
    files = written["all"]
    for name, text in files.items():
        if name.endswith(".json"):
            json.loads(text)
        elif name.endswith(".csv"):
            rows = list(csv.reader(io.StringIO(text)))
            assert len({len(r) for r in rows}) == 1
        elif name.endswith(".toml"):
            tomllib.loads(text)
    bash = shutil.which("bash")
    if bash:
        for name in files:
            if name.endswith((".sh", ".sbatch")):
                r = subprocess.run(
                    [bash, "-n", str(tmp_path / "all" / name)], capture_output=True, text=True
                )
                assert r.returncode == 0, f"{name}: {r.stderr}"
    check_all(problem, plan, files)
    bom = json.loads(files["bom.json"])
    assert bom["totals"]["capex_usd"] == pytest.approx(evaluate(problem, plan).capex_usd)


@pytest.mark.parametrize(
    ("job", "present", "absent"),
    [
        (
            {},
            [
                "--sequence-parallel",
                "--overlap-grad-reduce",
                "--overlap-param-gather",
                "--tp-comm-overlap",
            ],
            [],
        ),
        (
            {"overlap": {"grad_reduce": False, "param_gather": False, "tp_comm": False}},
            ["--sequence-parallel"],
            ["--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap"],
        ),
        (
            {"zero1": False, "sequence_parallel": False},
            ["--overlap-grad-reduce"],
            ["--sequence-parallel", "--overlap-param-gather", "--tp-comm-overlap"],
        ),
    ],
)
def test_megatron_flags_match_the_overlap_the_model_prices(job, present, absent):
    """The step time assumes job.overlap and job.sequence_parallel; Megatron gets the flags."""
    problem = problem_from_data(
        {
            "name": "ov",
            "sites": [{"name": "A", **H100}],
            "job": {"model": "tiny-8l", "global_batch": 4, **job},
        }
    )
    text = _render_unchecked(problem, _plan(2, 2, [(2, ["A", "A"])], [4, 4]))["megatron_args.sh"]
    for flag in present:
        assert flag in text
    for flag in absent:
        assert flag not in text


# ----------------------------------------------------------------------------- hosts apart from NVLink domains  # noqa: E501


def test_nvl72_rack_is_18_hosts_of_4_gpus():
    """hardware.md: an NVL72 rack is 18 hosts of 4 GPUs; tp=8 spans two hosts of one rack."""
    problem, plan = case_hetero_nodes()
    lay = build_layout(problem, plan)
    g_units = [u for u in lay.node_ranks if u.site == "G"]
    assert all(u.nproc == 4 for u in g_units)  # never --nproc_per_node=40 or 72
    files = render(problem, plan, "all")
    assert all(int(n.split("=")[1]) <= 4 for n in re.findall(r"slots=\d+", files["hosts_G.txt"]))
    # G holds 5 + 3 + 3 = 11 TP groups of 8; a rack takes 72 // 8 = 9 of them (2 hosts each).
    # Each stage's groups stay in one rack (PerfModel.node_fill's layout, first-fit
    # decreasing): rack 0 takes the 5 and a 3 (hosts 0-15), rack 1 the other 3 (hosts 18-23)
    rows = [r for r in lay.ranks if r.site == "G"]
    assert lay.hosts_by_site["G"] == [*range(16), *range(18, 24)]
    assert {r.domain for r in rows} == {0, 1}
    for p in {r.pp for r in rows}:
        assert len({r.domain for r in rows if r.pp == p}) == 1
    assert all(r.node // 18 == r.domain for r in rows)
    for p, d in {(r.pp, r.dp) for r in rows}:
        group = [r for r in rows if (r.pp, r.dp) == (p, d)]
        assert len({r.node for r in group}) == 2 and sorted(r.local_gpu for r in group) == [
            0,
            0,
            1,
            1,
            2,
            2,
            3,
            3,
        ]
    assert "#SBATCH --exclusive" in files["slurm.sbatch"]  # 4- and 8-GPU hosts in one job


def test_tp16_on_nvl72_leaves_the_last_two_trays_idle():
    problem = _problem([{"name": "G", "gpu": "gb200", "gpus": 144}], [], global_batch=5)
    plan = _plan(16, 1, [(5, ["G"])], [8])
    lay = build_layout(problem, plan)
    # 4 TP groups of 16 per rack = hosts 0-15; the 5th group opens rack 1 at host 18
    assert lay.hosts_by_site["G"] == [*range(16), 18, 19, 20, 21]
    assert lay.nodes_by_site["G"] == 2


def test_named_hosts_replace_placeholders_everywhere(tmp_path):
    a = [f"gpu-a{i:03d}" for i in range(8)]
    (tmp_path / "b.hosts").write_text(
        "# site B\n" + "".join(f"b{i}.example slots=8\n" for i in range(8))
    )
    sites = [{"name": "A", **H100, "hosts": a}, {"name": "B", **H100, "hostfile": "b.hosts"}]
    prob = problem_from_data(
        {
            "name": "named",
            "sites": sites,
            "routes": AB,
            "job": {"model": "tiny-8l", "global_batch": 12},
        },
        base=tmp_path,
    )
    _, plan = case_split_pipeline()
    files = render(prob, plan, "all")
    used = {*files["slurm_nodes.txt"].split()}
    assert used and used <= {*a, *(f"b{i}.example" for i in range(8))}
    for name, text in files.items():
        assert not re.search(r"\b[AB]-node\d", text), f"{name} still has a placeholder host"
    assert (
        f"#SBATCH --nodelist={','.join(files['slurm_nodes.txt'].split())}" in files["slurm.sbatch"]
    )


@pytest.mark.parametrize(
    ("site", "msg"),
    [
        ({"hosts": ["h0", "h1"]}, "64 GPUs = 8 hosts of 8 GPUs, 2 host names given"),
        ({"hosts": ["h"] * 8}, "host 'h' named twice"),
        ({"hosts": ["h0"], "hostfile": "x"}, "either hosts or hostfile"),
        ({"gpus_per_host": 3}, "whole number of hosts of 3 GPUs"),
        ({"hostfile": "missing.txt"}, "cannot read the hostfile"),
    ],
)
def test_bad_hosts_are_input_errors(site, msg, tmp_path):
    with pytest.raises(InputError, match=re.escape(msg)):
        problem_from_data(
            {
                "name": "x",
                "sites": [{"name": "A", **H100, **site}],
                "routes": [],
                "job": {"model": "tiny-8l", "global_batch": 8},
            },
            base=tmp_path,
        )


def test_catalog_host_shape_defaults():
    prob = _problem(
        [
            {"name": "G", "gpu": "gb300", "gpus": 72},
            {"name": "H", **H100},
            {"name": "S", "gpu": "h100-sxm", "gpus": 8, "gpus_per_node": 4},
        ],
        [],
        global_batch=8,
    )
    assert [site_gpus_per_host(prob, s) for s in "GHS"] == [4, 8, 4]
    assert [site_gpus_per_node(prob, s) for s in "GHS"] == [72, 8, 4]


# ----------------------------------------------------------------------------- framework flags


def _megatron_flags(problem, plan) -> set[str]:
    text = render(problem, plan, "megatron")["megatron_args.sh"]
    return {t for t in text.split("MEGATRON_ARGS=(")[1].split() if t.startswith("--")}


def test_megatron_llama_and_memory_model_flags():
    prob = _problem([{"name": "A", **H100}], [], global_batch=8, model="tiny-gqa")
    plan = _plan(2, 2, [(4, ["A", "A"])], [2, 2])
    text = render(prob, plan, "megatron")["megatron_args.sh"]
    flags = _megatron_flags(prob, plan)
    assert {
        "--sequence-parallel",
        "--position-embedding-type",
        "--normalization",
        "--disable-bias-linear",
        "--swiglu",
        "--group-query-attention",
    } <= flags
    assert "--untie-embeddings-and-output-weights" not in flags  # tiny-gqa ties its embeddings
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text  # H100 = compute capability 9.0 < 10
    # the plan does not interleave (virtual_stages 1): no virtual-stage flag at all
    assert (
        not {
            "--num-layers-per-virtual-pipeline-stage",
            "--num-virtual-stages-per-pipeline-rank",
        }
        & flags
    )


def test_megatron_gpt_family_and_blackwell():
    prob = _problem(
        [{"name": "G", "gpu": "gb200", "gpus": 72}], [], global_batch=16, model="tiny-8l"
    )
    plan = _plan(4, 1, [(8, ["G"])], [8])
    text = render(prob, plan, "megatron")["megatron_args.sh"]
    flags = _megatron_flags(prob, plan)
    assert (
        "--sequence-parallel" in flags
        and "CUDA_DEVICE_MAX_CONNECTIONS" not in text.split("MEGATRON_ARGS")[0].split("#")[-1]
    )
    assert "export CUDA_DEVICE_MAX_CONNECTIONS" not in text
    if not prob.model.gated_ffn:
        assert "--normalization" not in flags and "--swiglu" not in flags


def test_torchtitan_02_toml_names_output_and_no_cuda_graph_key():
    problem, plan = case_split_pipeline()
    files = render(problem, plan, "torchtitan", torchtitan_version="0.2")
    cfg = tomllib.loads(files["torchtitan.toml"])
    assert cfg["parallelism"]["module_fqns_per_model_part"][-1][-2:] == ["norm", "output"]
    assert "disable_cuda_graphs" not in cfg["training"]
    new = render(problem, plan, "torchtitan")["torchtitan_args.sh"]
    args = parse_torchtitan_args(new)
    assert "--training.disable_cuda_graphs" in args and args[args.index("--module") + 1] == "llama3"
    with pytest.raises(InputError, match="torchtitan-version"):
        render(problem, plan, "torchtitan", torchtitan_version="0.1")


# ----------------------------------------------------------------------------- CP and EP


@pytest.mark.parametrize(
    ("cp", "ep", "tp", "gpn"),
    [(2, 2, 2, 4), (1, 4, 1, 8), (2, 1, 2, 8), (1, 8, 1, 4)],
)
def test_cp_ep_layouts_export(cp: int, ep: int, tp: int, gpn: int) -> None:
    """Replica stages of tp x cp x ep GPUs (inside a node, or spanning whole nodes): the
    rank map, Megatron's tp-cp-ep-dp-pp order and torchtitan's mesh pass the independent
    checks above (TP inside a domain, CP and EP inside a site, the plan's chains)."""
    width = tp * cp * ep
    data = {
        "name": "cp-ep",
        "sites": [
            {"name": s, "gpu": "h100-sxm", "gpus": 2 * width, "gpus_per_node": gpn}
            for s in ("a", "b")
        ],
        "routes": [{"sites": ["a", "b"], "km": 50}],
        "job": {"model": "tiny-moe", "global_batch": 8 * ep},
    }
    problem = problem_from_data(data)
    plan = Plan.model_validate(
        {
            "parallelism": {"tp": tp, "cp": cp, "ep": ep, "pp": 2, "dp": 2, "micro_batch": 1},
            "stage_layers": [2, 2],
            "replica_groups": [
                {"count": 1, "stage_sites": ["a", "b"]},
                {"count": 1, "stage_sites": ["b", "a"]},
            ],
            "links": [{"sites": ["a", "b"], "waves": 1}],
        }
    )
    assert evaluate(problem, plan).feasible
    files = render(problem, plan, "all")
    check_all(problem, plan, files)
    args = files["megatron_args.sh"]
    if cp > 1:
        assert f"--context-parallel-size {cp}" in args
    if ep > 1:
        assert f"--expert-model-parallel-size {ep} --expert-tensor-parallel-size 1" in args
        assert "--moe-layer-freq '([0]*1+[1]*3)'" in args
    assert f"--parallelism.context_parallel_degree {cp}" in files["torchtitan_args.sh"]


def test_torchrun_script_fails_when_one_of_its_torchruns_fails(tmp_path):
    """A host with two node ranks runs two torchruns in the background; the script must
    exit with the failing one's code (a bare `wait` exited 0). Run by bash, with a
    `torchrun` on PATH that fails for node rank 3 only."""
    import os

    from placer.outputs import launch

    problem, plan = case_mixed()
    lay = build_layout(problem, plan)
    host = next(u.host for u in lay.node_ranks if u.index == 3)
    assert sum(u.host == host for u in lay.node_ranks) == 2  # two torchruns on that host
    script = tmp_path / "torchrun_A.sh"
    script.write_text(launch.torchrun_files(lay)["torchrun_A.sh"])
    fake = tmp_path / "bin" / "torchrun"
    fake.parent.mkdir()
    fake.write_text('#!/usr/bin/env bash\n[[ " $* " == *" --node_rank=3 "* ]] && exit 3\nexit 0\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "MASTER_ADDR": "x"}
    env["TRAIN_SCRIPT"] = "train.py"
    r = subprocess.run(["bash", str(script), host], env=env, capture_output=True, text=True)
    assert r.returncode == 3, r.stderr
    ok = next(u.host for u in lay.node_ranks if u.site == "A" and u.host != host)
    assert subprocess.run(["bash", str(script), ok], env=env).returncode == 0


@pytest.mark.parametrize(
    "groups",
    [
        [(2, ["B", "B"]), (3, ["A", "A"]), (2, ["A", "B"])],
        [(5, ["A", "B"]), (6, ["B", "A"])],
        [(3, ["A", "A"]), (3, ["B", "B"])],
        [(7, ["A", "A"]), (2, ["A", "B"]), (1, ["B", "B"])],
    ],
)
def test_rank_map_packs_each_stage_as_the_sync_is_priced(groups):
    """tp 2 on 8-GPU nodes: q = 4 TP groups a node. At every site each stage's members
    sit in ceil(n / q) nodes, all of them full but the last, which holds n mod q (the
    layout PerfModel.node_fill prices: a part-filled node's r NICs carry its q shard
    rings), and the site uses the evaluator's node count, ceil(its groups / q)."""
    from collections import Counter

    dp = sum(c for c, _ in groups)
    prob = _problem([{"name": "A", **H100}, {"name": "B", **H100}], AB, global_batch=dp)
    plan = _plan(2, 2, groups, [5, 3], [{"sites": ["A", "B"], "waves": 1}])
    lay = build_layout(prob, plan)
    on_node: Counter = Counter()  # (site, stage, node) -> TP groups
    for r in lay.ranks:
        if r.tp == 0:
            on_node[(r.site, r.pp, r.domain)] += 1
    for site in ("A", "B"):
        groups_here = sum(n for (s, _, _), n in on_node.items() if s == site)
        assert lay.nodes_by_site[site] == -(-groups_here // 4)
        for k in range(2):
            counts = sorted(
                (n for (s, p, _), n in on_node.items() if (s, p) == (site, k)), reverse=True
            )
            n = sum(counts)
            assert len(counts) == -(-n // 4), (site, k, counts)
            assert all(c == 4 for c in counts[:-1]), (site, k, counts)


@pytest.mark.parametrize(
    ("recompute", "mode"), [("full", "full"), ("selective", "none"), ("none", "none")]
)
def test_torchtitan_activation_checkpointing_is_the_priced_recompute(
    tmp_path: Path, recompute: str, mode: str
) -> None:
    """The TOML pins activation_checkpoint.mode to what the plan priced (torchtitan's default,
    per-op selective AC, is neither placer's selective nor full): full -> "full", selective /
    none -> "none" (SDPA's flash attention recomputes the attention core in the backward,
    placer's "selective"). torchtitan 0.3 (a config class per AC policy) gets the note."""
    from placer.io import load_plan, problem_with

    case = Path(__file__).resolve().parent.parent / "consumers" / "case"
    base = load_instance(case / "instance.yaml")
    job = {**base.instance.job.model_dump(mode="json"), "recompute": recompute}
    prob = problem_with(base, job=job)
    plan_ = load_plan(case / "plan.json")
    export(prob, plan_, "torchtitan", tmp_path / "t2", torchtitan_version="0.2")
    toml = tomllib.loads((tmp_path / "t2" / "torchtitan.toml").read_text())
    assert toml["activation_checkpoint"]["mode"] == mode
    export(prob, plan_, "torchtitan", tmp_path / "t3")
    args = (tmp_path / "t3" / "torchtitan_args.sh").read_text()
    assert f"plan prices recompute '{recompute}'" in args
    assert ("FullAC" in args) == (mode == "full")
