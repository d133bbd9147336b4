"""Running a sweep: one point per task, on a local process pool or dask.distributed,
records written as points finish."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from placer.errors import InputError, PlacerError
from placer.io import (
    Problem,
)
from placer.study.progress import _Progress
from placer.study.results import (
    _read_record,
    _write_manifest,
    _write_record,
    results_table,
    write_table,
)
from placer.study.spec import RECORD_VERSION, STATUSES, Point, Study

if TYPE_CHECKING:
    import pandas as pd


# ----------------------------------------------------------------------------- one point


@dataclass(frozen=True)
class Task:
    """What a worker needs: picklable, no file access (the problem is already resolved)."""

    id: str
    overrides: dict[str, Any]
    problem: Problem
    backend: str | None
    time_limit_s: float | None
    fingerprint: str
    quiet: bool = True  # silence solver chatter on the worker's stdout (HiGHS banner)


@contextlib.contextmanager
def _quiet_stdout(enabled: bool) -> Iterator[None]:
    """Point file descriptor 1 at /dev/null (native solver libraries print there)."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def run_point(task: Task) -> dict[str, Any]:
    """Solve one point with one solver thread; never raises: failures become records."""
    from placer.errors import InfeasibleError, TimeLimitError
    from placer.optimize.driver import solve

    rec: dict[str, Any] = {
        "version": RECORD_VERSION,
        "id": task.id,
        "overrides": task.overrides,
        "fingerprint": task.fingerprint,
        "status": "error",
        "message": "",
        "metrics": {},
        "plan": None,
    }
    try:
        with _quiet_stdout(task.quiet):
            res = solve(
                task.problem, backend=task.backend, time_limit_s=task.time_limit_s, threads=1
            )
    except InfeasibleError as exc:
        rec.update(status="infeasible", message=str(exc))
        return rec
    except TimeLimitError as exc:
        rec.update(status="time_limit", message=str(exc))
        return rec
    except PlacerError as exc:
        rec.update(status="error", message=f"{type(exc).__name__}: {exc}")
        return rec
    except Exception as exc:  # noqa: BLE001 - a failed point is a row, not a crashed sweep
        rec.update(status="error", message=f"internal error: {type(exc).__name__}: {exc}")
        return rec
    plan = res.plan.model_dump(mode="json", exclude_none=True)
    rec.update(status=res.status, plan=plan, metrics=_metrics(task.problem, res, plan))
    return rec


def _metrics(problem: Problem, res: Any, plan: dict[str, Any]) -> dict[str, Any]:
    ev = res.evaluation
    par = plan["parallelism"]
    groups = plan.get("replica_groups", [])
    sites_used = sorted({s for g in groups for s in g["stage_sites"]})
    if any(len(set(g["stage_sites"])) > 1 for g in groups):
        layout = "pipeline-across-sites"
    elif len(sites_used) > 1:
        layout = "replicas-per-site"
    else:
        layout = "single-site"
    m: dict[str, Any] = {"step_time_s": ev.step_time_s}
    m.update({k: float(v) for k, v in ev.breakdown.items()})
    m.update(
        tokens_per_s=ev.tokens_per_s,
        mfu=ev.mfu,
        capex_usd=ev.capex_usd,
        cost_per_token_usd=ev.cost_per_token_usd if math.isfinite(ev.cost_per_token_usd) else None,
        power_mw=float(sum(ev.power_mw.values())),
        sync_mode=ev.sync_mode,
        layout=layout,
        sites_used=len(sites_used),
        gpus=int(sum(ev.gpus_by_site.values())),
        tp=par["tp"],
        pp=par["pp"],
        dp=par["dp"],
        micro_batch=par["micro_batch"],
    )
    waves = {_route_label(link["sites"]): int(link["waves"]) for link in plan.get("links", [])}
    for r in problem.instance.routes:
        lab = _route_label(r.sites)
        m[f"waves[{lab}]"] = waves.get(lab, 0)
    # columns of the resilience feature (plan["resilience"], written when the instance has a
    # resilience: block): spare waves under ring vs OptCC, worst single-failure slowdown
    m.update(resilience_columns(plan.get("resilience")))
    m.update(solver_s=float(res.seconds), gap=float(res.gap))
    return m


def _route_label(sites: Iterable[str]) -> str:
    a, b = sorted(sites)
    return f"{a}-{b}"


def resilience_columns(res: Any) -> dict[str, Any]:
    """Flat columns from a plan's resilience summary; tolerant of absent keys."""
    if not isinstance(res, dict):
        return {}
    out: dict[str, Any] = {}
    for name in ("ring", "optcc"):
        key = f"spare_waves_{name}"
        if key in res:
            out[key] = res[key]
        for route, n in sorted((res.get(f"{key}_by_route") or {}).items()):
            out[f"{key}[{route}]"] = n
    if "collective" in res:
        out["resilience_collective"] = res["collective"]
    fail = res.get("failures") if isinstance(res.get("failures"), dict) else {}
    worst = fail.get("worst") if isinstance(fail.get("worst"), dict) else None
    healthy = fail.get("healthy_step_time_s")
    if worst is not None:
        steps = worst.get("step_time_s") or {}
        t_w = steps.get(fail.get("collective") or res.get("collective"))
        out["worst_failure"] = worst.get("description")
        out["worst_failure_step_time_s"] = t_w
        if t_w is not None and healthy:
            out["worst_failure_slowdown"] = t_w / healthy - 1
    if "survives" in fail:
        out["survives"] = bool(fail["survives"])
    for k, v in res.items():
        if k.endswith("_error") and isinstance(v, str):
            out[f"resilience_{k}"] = v
    return out


# ----------------------------------------------------------------------------- the sweep


@dataclass
class SweepResult:
    out_dir: Path
    table: pd.DataFrame
    computed: list[str]  # ids solved in this run, in completion order
    reused: list[str]  # ids whose finished record was reused
    interrupted: bool = False

    @property
    def counts(self) -> dict[str, int]:
        return {
            s: int((self.table["status"] == s).sum()) for s in STATUSES if "status" in self.table
        }


def run_sweep(
    study: Study,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    executor: Literal["local", "dask"] = "local",
    workers: int | None = None,
    scheduler: str | None = None,
    progress: bool = True,
) -> SweepResult:
    """Solve every point not already finished in `out_dir`; write the records and the table."""
    if executor not in {"local", "dask"}:
        raise InputError(f"--executor: expected local or dask, got '{executor}'")
    if workers is not None and workers < 1:
        raise InputError(f"--workers: must be >= 1, got {workers}")
    out = Path(out_dir) if out_dir is not None else Path("out") / "sweeps" / study.name
    points_dir = out / "points"
    points_dir.mkdir(parents=True, exist_ok=True)
    _write_manifest(out, study)

    records: dict[str, dict[str, Any]] = {}
    todo: list[Point] = []
    reused: list[str] = []
    for p in study.points:
        rec = _read_record(points_dir / f"{p.id}.json", p.id)
        if (
            rec is not None
            and rec.get("fingerprint") == p.fingerprint
            and rec.get("status") != "error"
        ):
            records[p.id] = rec
            reused.append(p.id)
        else:
            todo.append(p)
    tasks = [
        Task(p.id, p.overrides, p.problem, study.backend, study.time_limit_s, p.fingerprint)
        for p in todo
    ]
    n_workers = workers or os.cpu_count() or 1

    computed: list[str] = []
    interrupted = False
    with _Progress(
        len(study.points), len(reused), records.values(), enabled=progress and bool(tasks)
    ) as bar:

        def finish(rec: dict[str, Any]) -> None:
            _write_record(points_dir / f"{rec['id']}.json", rec)
            records[rec["id"]] = rec
            computed.append(rec["id"])
            bar.advance(rec)

        try:
            if tasks:
                runner = _run_dask if executor == "dask" else _run_local
                for rec in runner(tasks, n_workers, scheduler, bar.start):
                    finish(rec)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            table = results_table(study, records)
            write_table(out, table)
    if interrupted:
        raise KeyboardInterrupt(
            f"sweep interrupted: {len(records)} of {len(study.points)} points done; re-run to resume"  # noqa: E501
        )
    return SweepResult(out, table, computed, reused, interrupted)


def _failed(task: Task, exc: BaseException) -> dict[str, Any]:
    return {
        "version": RECORD_VERSION,
        "id": task.id,
        "overrides": task.overrides,
        "fingerprint": task.fingerprint,
        "status": "error",
        "message": f"worker failure: {type(exc).__name__}: {exc}",
        "metrics": {},
        "plan": None,
    }


MANAGER_JOIN_S = 5.0  # bound on the wait for the stopped pool (terminated workers end at once)
POLL_S = 0.2  # how often the local pool's wait looks for a stop request (a point takes longer)


def _run_local(
    tasks: list[Task], workers: int, scheduler: str | None, started: Callable[[], None]
) -> Iterator[dict[str, Any]]:
    import concurrent.futures as cf
    import multiprocessing as mp

    if scheduler:
        raise InputError("--scheduler needs --executor dask")
    # fork on Linux: fast, and a script or notebook without a __main__ guard still works
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    pool = cf.ProcessPoolExecutor(
        max_workers=min(workers, len(tasks)), mp_context=ctx, initializer=_ignore_sigint
    )
    from placer import interrupt

    try:
        # Ctrl-C / SIGTERM only record a request here, polled between waits: raised as
        # KeyboardInterrupt at an arbitrary bytecode it can be lost in a finalizer, or leave
        # a future's lock held so that the pool's manager thread (joined at exit) never ends
        with interrupt.handle_signals():
            futures = {
                pool.submit(run_point, t): t for t in tasks
            }  # processes start here (before the progress thread)
            started()
            pending = set(futures)
            while pending:
                if stop := interrupt.requested():
                    raise KeyboardInterrupt(stop)
                done, pending = cf.wait(pending, timeout=POLL_S, return_when=cf.FIRST_COMPLETED)
                for fut in sorted(done, key=lambda f: futures[f].id):
                    try:
                        yield fut.result()
                    except Exception as exc:  # noqa: BLE001 - e.g. a worker killed by the OS
                        yield _failed(futures[fut], exc)
    except BaseException:
        # Ctrl-C (or the consumer stopped): drop the queue and stop the running solves now;
        # finished points are already on disk
        manager = getattr(pool, "_executor_manager_thread", None)
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        # wait for the pool's manager thread to see the terminated workers and close its
        # wake-up pipe: left running, it races CPython 3.11's exit hook
        # (concurrent.futures.process._python_exit writes to that pipe without the pool's
        # lock), which prints "OSError: [Errno 9] Bad file descriptor" at exit
        if manager is not None:
            manager.join(timeout=MANAGER_JOIN_S)
        raise
    pool.shutdown(wait=True)


def _ignore_sigint() -> None:
    """Workers leave Ctrl-C to the parent, which stops them and keeps what is finished;
    they die with the parent, however it ends (even SIGKILL). SIGTERM gets its default
    action back: a forked worker inherits the command's handler, which turns it into a
    KeyboardInterrupt that the pool's worker loop catches and reports as one failed point
    before it takes the next one, so the parent's terminate() would not end it."""
    import signal

    from placer.interrupt import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent()


def _run_dask(
    tasks: list[Task], workers: int, scheduler: str | None, started: Callable[[], None]
) -> Iterator[dict[str, Any]]:
    try:
        from dask.distributed import Client, LocalCluster, as_completed
    except ImportError as exc:  # pragma: no cover - dask is a dependency
        raise InputError(f"--executor dask: dask.distributed is not importable ({exc})") from None

    cluster = None
    try:
        if scheduler:
            client = Client(scheduler, timeout="10s")
        else:
            cluster = LocalCluster(
                n_workers=min(workers, len(tasks)),
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
                silence_logs=logging.ERROR,
            )
            client = Client(cluster)
    except OSError as exc:
        if cluster is not None:
            cluster.close()
        raise InputError(f"--scheduler: cannot connect to '{scheduler}' ({exc})") from None
    try:
        run = uuid.uuid4().hex[:8]
        futures = {
            client.submit(run_point, t, key=f"placer-point-{t.id}-{run}", pure=False): t
            for t in tasks
        }
        started()
        for fut in as_completed(list(futures)):
            try:
                yield fut.result()
            except Exception as exc:  # noqa: BLE001 - a worker lost by dask
                yield _failed(futures[fut], exc)
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
