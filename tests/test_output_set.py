"""Outputs as a set (issue 15): a reader sees the previous run's files or the new run's,
never a mix, whatever kills the process; OS errors are exit 2 naming the path; no output
escapes DIR. Ctrl-C / SIGTERM keep the best plan (status feasible) and exit 130."""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from placer.cli import app
from placer.outputs import fileset
from placer.outputs.fileset import read_manifest, verify_set, write_set

ROOT = Path(__file__).resolve().parents[1]
TWO = ROOT / "instances" / "two-campus-100km.yaml"
OLD = "previous-run"  # the name of the old set's instance
METRO = ROOT / "instances" / "four-metro-resilient.yaml"
PLACER = [sys.executable, "-c", "from placer._entry import main; main()"]
runner = CliRunner()


def _consistent(folder: Path) -> str:
    """The instance of the set in `folder`, after checking every file against the manifest."""
    assert verify_set(folder), sorted(p.name for p in folder.iterdir())
    man = read_manifest(folder)
    plan = json.loads((folder / "plan.json").read_text())
    assert plan["instance"] == man["run"]["instance"]
    assert set(man["files"]) == {"plan.json", "bom.csv", "report.md", "report.html"}
    return plan["instance"]


@pytest.fixture(scope="module")
def old_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A previous run's output set, solved once and copied into each test that needs an
    old set to keep or replace: two-campus renamed (OLD) with a shorter route, so that the old
    and the new set differ in every file and a mix of the two is seen (three-sites took a
    minute of the serial pass)."""
    tmp = tmp_path_factory.mktemp("old")
    inst = tmp / "old.yaml"
    text = TWO.read_text().replace("name: two-campus-100km", f"name: {OLD}")
    inst.write_text(text.replace("km: 100", "km: 60"))  # another route: another BOM
    out = tmp / "out"
    assert runner.invoke(app, ["solve", str(inst), "-q", "-o", str(out)]).exit_code == 0
    assert _consistent(out) == OLD
    return out


@pytest.mark.parametrize(
    "args,needle",
    [
        (["-o", ""], "-o: empty path"),
        (["-o", "{tmp}/file"], "{tmp}/file: the output folder is an existing file"),
        (["-o", "{tmp}/file/sub"], "{tmp}/file: a parent of the output folder"),
    ],
)
def test_bad_output_paths_are_exit_2(tmp_path: Path, args: list[str], needle: str) -> None:
    (tmp_path / "file").write_text("x")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = runner.invoke(app, ["solve", str(TWO), "-q", "--time-limit", "10", *args])
    assert r.exit_code == 2, r.output
    assert needle.replace("{tmp}", str(tmp_path)) in r.output
    assert (tmp_path / "file").read_text() == "x"


def test_dot_names_cannot_escape_the_output_folder(tmp_path: Path) -> None:
    for name in ("..", "."):
        f = tmp_path / "i.yaml"
        f.write_text(TWO.read_text().replace("name: two-campus-100km", f"name: '{name}'"))
        r = runner.invoke(app, ["solve", str(f), "-q"])
        assert r.exit_code == 2 and f"{f}:2: name: must not consist of dots only" in r.output


def test_os_error_mid_set_is_exit_2_and_keeps_the_old_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, old_set: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(old_set, out, symlinks=True)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = Path.write_bytes
    calls = []

    def full_disk(self: Path, data: bytes) -> int:
        calls.append(self)
        if self.name == "bom.csv":  # the second file of the set (plan.json is written first)
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    r = runner.invoke(app, ["solve", str(TWO), "-q", "-o", str(out)])
    assert r.exit_code == 2 and "No space left on device" in r.output and str(out) in r.output
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folder left


def test_read_only_target_is_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def denied(*_a: object, **_k: object) -> str:
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path))

    monkeypatch.setattr(fileset.tempfile, "mkdtemp", denied)
    r = runner.invoke(app, ["solve", str(TWO), "-q", "-o", str(tmp_path / "out")])
    assert (
        r.exit_code == 2
        and f"{tmp_path / 'out'}: cannot write output (Permission denied" in r.output
    )


def test_foreign_folder_keeps_user_files_and_gets_a_manifest(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    assert runner.invoke(app, ["solve", str(TWO), "-q", "-o", str(tmp_path)]).exit_code == 0
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert _consistent(tmp_path) == "two-campus-100km"


def test_concurrent_reader_never_sees_a_mix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    monkeypatch.setattr(
        fileset, "OUTPUT_NAME", fileset.re.compile(r"^(a\.txt|b\.txt|manifest\.json)$")
    )
    write_set(out, {"a.txt": "0", "b.txt": "0"})
    stop, seen, bad = threading.Event(), set(), []

    def cat(name: str, fd: int) -> bytes:
        f = os.open(name, os.O_RDONLY, dir_fd=fd)
        try:
            return os.read(f, 100)
        finally:
            os.close(f)

    def read() -> None:
        while not stop.is_set():
            try:
                fd = os.open(out, os.O_RDONLY)  # a folder handle: one set, however it is swapped
            except FileNotFoundError:
                continue
            try:
                a, b = cat("a.txt", fd), cat("b.txt", fd)
            except FileNotFoundError:
                continue
            finally:
                os.close(fd)
            seen.add(a)
            if a != b:
                bad.append((a, b))

    t = threading.Thread(target=read)
    t.start()
    try:
        for i in range(1, 200):
            write_set(out, {"a.txt": str(i), "b.txt": str(i)})
    finally:
        stop.set()
        t.join()
    assert not bad and len(seen) > 1


def _start(args: list[str], **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*PLACER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, **kw
    )


def test_sigkill_while_writing_leaves_the_old_or_the_new_set(tmp_path: Path, old_set: Path) -> None:
    """Kill the writer the moment its temporary folder appears (and at random times)."""
    out = tmp_path / "out"
    shutil.copytree(old_set, out, symlinks=True)
    rng = random.Random(15)
    seen = set()
    for attempt in range(6):
        p = _start(["solve", str(TWO), "-q", "-o", str(out)])
        t0 = time.monotonic()
        delay = rng.uniform(0, 0.05) if attempt % 2 else None
        while p.poll() is None and time.monotonic() - t0 < 60:
            tmp = [e for e in tmp_path.iterdir() if e.name.startswith(".out.new-")]
            if tmp and (delay is None or time.monotonic() - t0 > delay):
                time.sleep(rng.uniform(0, 0.01))
                p.kill()
                break
            time.sleep(0.0005)
        p.communicate()
        seen.add(_consistent(out))
    assert seen <= {OLD, "two-campus-100km"}
    r = runner.invoke(app, ["solve", str(TWO), "-q", "-o", str(out)])  # a later run cleans up
    assert r.exit_code == 0 and _consistent(out) == "two-campus-100km"
    assert [e.name for e in tmp_path.iterdir()] == ["out"]


def _interrupt_when(p: subprocess.Popen[str], marker: str, sig: int) -> str:
    assert p.stderr is not None
    lines = []
    for line in p.stderr:
        lines.append(line)
        if marker in line:
            p.send_signal(sig)
            break
    rest = p.communicate(timeout=60)[1]
    return "".join(lines) + rest


@pytest.mark.parametrize("backend,sig", [("cpsat", signal.SIGINT), ("milp", signal.SIGTERM)])
def test_signal_mid_search_keeps_the_best_plan_as_feasible(
    tmp_path: Path, backend: str, sig: int, old_set: Path
) -> None:
    out = tmp_path / "out"
    shutil.copytree(old_set, out, symlinks=True)
    p = _start(["solve", str(METRO), "-o", str(out), "--backend", backend, "--time-limit", "60"])
    t0 = time.monotonic()
    err = _interrupt_when(p, "incumbent greedy", sig)  # the backend search is under way
    assert "Traceback" not in err
    if p.returncode == 0:  # the search ended before the signal landed: a full run
        assert _consistent(out) == "four-metro-resilient"
        return
    assert p.returncode == 130, err
    assert time.monotonic() - t0 < 30
    assert f"interrupted by {signal.Signals(sig).name}" in err
    assert _consistent(out) == "four-metro-resilient"
    plan = json.loads((out / "plan.json").read_text())
    assert plan["status"] == "feasible" and plan["solver"]["status"] == "feasible"
    assert 0 <= plan["solver"]["gap"] <= 1
    ev = runner.invoke(app, ["evaluate", str(METRO), str(out / "plan.json")])
    assert ev.exit_code == 0  # the kept plan is a real, feasible plan


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (Linux /proc SigCgt): the interpreter
    installs none, so it is placer._entry's first statement that has run."""
    try:
        status = (Path("/proc") / str(pid) / "status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


def test_signal_during_start_up_is_exit_130_without_traceback(tmp_path: Path) -> None:
    """From placer's first statement on (the interpreter's own start, before any of
    placer's code runs, keeps Python's default), a signal while the command imports
    typer, pydantic and OR-Tools is exit 130 with one line. The signal is sent a while
    after the handler is in place, not a fixed time after the start: under load the
    interpreter alone can take longer than that."""
    out = tmp_path / "out"
    linux = sys.platform.startswith("linux")
    for delay in (0.0, 0.2, 0.5):
        p = _start(["solve", str(TWO), "-q", "-o", str(out)])
        t0 = time.monotonic()
        while linux and not _catches_sigterm(p.pid) and time.monotonic() - t0 < 30:
            time.sleep(0.001)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
        assert p.returncode in (0, 130) and "Traceback" not in err, err
        assert not out.exists() or _consistent(out) == "two-campus-100km"


def test_an_interrupt_wrapped_by_class_creation_is_exit_130() -> None:
    """The CI failure of stop 19: SIGINT landed while a pydantic model class was created
    (a lazy import after the command began); Python 3.11 re-raises it from __set_name__ as
    RuntimeError, which the command reported as an internal error with exit 1."""
    import typer

    from placer.cli_support import guard

    class Interrupts:
        def __set_name__(self, owner: type, name: str) -> None:
            raise KeyboardInterrupt("SIGINT")

    def command() -> None:
        type("InnerData", (), {"stage_sites": Interrupts()})

    with pytest.raises(typer.Exit) as exc:
        guard(command)()
    assert exc.value.exit_code == 130

    def broken() -> None:
        raise RuntimeError("a real bug")

    with pytest.raises(typer.Exit) as exc:
        guard(broken)()
    assert exc.value.exit_code == 1


def test_every_file_placer_writes_is_known_as_its_own() -> None:
    """A name missing from fileset.OUTPUT_NAME would make placer's own folder look foreign
    (written in place, not swapped in as a set)."""
    import json as _json

    from placer.io import load_instance
    from placer.outputs.export import FORMAT_NAMES, render

    prob = load_instance(TWO)
    plan = _json.loads((ROOT / "instances" / "plans" / "two-campus-100km.json").read_text())
    names = {"plan.json", "bom.csv", "report.md", "report.html", fileset.MANIFEST}
    for fmt in FORMAT_NAMES:
        names |= set(render(prob, plan, fmt))
    names |= set(render(prob, plan, "torchtitan", "0.2"))
    assert [n for n in sorted(names) if not fileset.OUTPUT_NAME.match(n)] == []
