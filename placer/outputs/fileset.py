"""Output folders written as a set: a reader sees the previous run's files or the new
run's files, never a mix, whatever kills the process and whenever.

Every file goes into a temporary folder beside DIR (`.DIR.new-<pid>-*`), with
`manifest.json` (file names, sizes, SHA-256, the run) written last; the temporary folder then
replaces DIR in one atomic step (Linux `renameat2(RENAME_EXCHANGE)`; elsewhere two renames,
and a reader who finds DIR missing for that instant still sees no mix). A folder that holds
anything but placer outputs (`-o .`, `-o ~`) is never replaced, so no user file is ever
deleted: there the old manifest is removed first, each file is renamed into place and the
new manifest is written last, so a reader who checks `manifest.json` (`verify_set`) never
takes a mix for a set. OS errors are exit 2 naming the path.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from placer.errors import InputError

MANIFEST = "manifest.json"
# what solve and export write (export: placer.outputs.export); a folder holding only these is
# a placer output folder and may be replaced
OUTPUT_NAME = re.compile(
    r"^(plan\.json|report\.(md|html)|manifest\.json|bom\.(csv|json|md)|rankmap\.(json|csv)|megatron_(args\.sh|hosts\.txt)"
    r"|torchtitan(\.toml|_args\.sh|_hosts\.txt)|torchrun_[A-Za-z0-9_.-]+\.sh|hosts_[A-Za-z0-9_.-]+\.txt|slurm(_hostfile\.txt|_nodes\.txt|\.sbatch))$"
)
_TMP = re.compile(r"^\.(?P<name>.+)\.(new|old)-(?P<pid>\d+)-")


def output_folder(raw: str | os.PathLike[str] | None, default: Path, option: str = "-o") -> Path:
    """The folder to write, refusing an empty path (which would mean the working folder)."""
    if raw is None:
        return default
    text = os.fspath(raw)
    if not text.strip():
        raise InputError(f"{option}: empty path (name an output folder)")
    return Path(text)


def _os_error(path: Path, exc: OSError) -> InputError:
    at = f"; at {exc.filename}" if exc.filename and str(exc.filename) != str(path) else ""
    return InputError(f"{path}: cannot write output ({exc.strerror or exc}{at})")


def _check_target(folder: Path) -> bool:
    """Refuse a file where the folder (or a parent) belongs; True when the folder holds
    files placer did not write (so it must not be swapped out)."""
    for p in [folder, *folder.parents]:
        if p.exists() and not p.is_dir():
            what = "the output folder" if p == folder else f"a parent of the output folder {folder}"
            raise InputError(f"{p}: {what} is an existing file, not a folder")
        if p.exists():
            break
    if not folder.is_dir():
        return False
    try:
        return any(not OUTPUT_NAME.match(e.name) for e in folder.iterdir())
    except OSError as exc:
        raise _os_error(folder, exc) from None


def _write_in_place(
    folder: Path, files: dict[str, str], run: dict[str, object] | None
) -> list[Path]:
    """Manifest mode for a folder with user files: old manifest out, files in, manifest last."""
    from placer.io import write_atomic

    try:
        (folder / MANIFEST).unlink(missing_ok=True)
    except OSError as exc:
        raise _os_error(folder / MANIFEST, exc) from None
    meta = {}
    for name, text in files.items():
        write_atomic(folder / name, text)
        data = text.encode("utf-8")
        meta[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {
        "placer_output_set": 1,
        "written_unix_s": round(time.time(), 3),
        "run": run or {},
        "files": meta,
    }
    write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return [folder / n for n in files]


def _sweep_stale(parent: Path, name: str) -> None:
    """Remove temporary folders that killed runs left beside DIR (their process is gone)."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for e in entries:
        m = _TMP.match(e.name)
        if m and m.group("name") == name and e.is_dir() and not _alive(int(m.group("pid"))):
            shutil.rmtree(e, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # a leftover of this very process (pid reuse): not in use
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    e = ctypes.get_errno()
    if e in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(e, os.strerror(e), str(b))


def write_set(
    folder: Path,
    files: dict[str, str],
    *,
    keep_others: bool = False,
    run: dict[str, object] | None = None,
) -> list[Path]:
    """Write `files` (name -> text) as DIR's new content in one step. With `keep_others`, the
    files already in DIR that are not rewritten stay (export adds to solve's folder)."""
    folder = Path(folder)
    if _check_target(folder):
        return _write_in_place(folder, files, run)
    parent = folder.absolute().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _os_error(parent, exc) from None
    _sweep_stale(parent, folder.name)
    tmp: Path | None = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.new-{os.getpid()}-", dir=parent))
        os.chmod(tmp, 0o777 & ~_umask())
        names = dict(files)
        if keep_others and folder.is_dir():
            for e in folder.iterdir():
                if e.name not in names and e.name != MANIFEST and e.is_file():
                    shutil.copy2(e, tmp / e.name)
        manifest_files = {}
        for name, text in names.items():
            data = text.encode("utf-8")
            (tmp / name).write_bytes(data)
            os.chmod(tmp / name, 0o666 & ~_umask())
            manifest_files[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        for e in sorted(tmp.iterdir()):
            if e.name not in manifest_files:
                data = e.read_bytes()
                manifest_files[e.name] = {
                    "bytes": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                }
        manifest = {
            "placer_output_set": 1,
            "written_unix_s": round(time.time(), 3),
            "run": run or {},
            "files": manifest_files,
        }
        (tmp / MANIFEST).write_text(
            json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8"
        )
        os.chmod(tmp / MANIFEST, 0o666 & ~_umask())
        _fsync_dir(tmp)
        if folder.exists():
            if not _exchange(tmp, folder):
                old = Path(
                    tempfile.mkdtemp(prefix=f".{folder.name}.old-{os.getpid()}-", dir=parent)
                )
                os.rmdir(old)
                os.rename(folder, old)
                os.rename(tmp, folder)
                tmp = old
        else:
            os.rename(tmp, folder)
            tmp = None
        _fsync_dir(parent)
    except OSError as exc:
        raise _os_error(folder, exc) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return [folder / n for n in files]


def read_manifest(folder: Path) -> dict[str, object] | None:
    try:
        return json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def verify_set(folder: Path) -> bool:
    """True when every file the manifest lists is there with its recorded checksum."""
    man = read_manifest(folder)
    if not man or not isinstance(man.get("files"), dict):
        return False
    for name, meta in man["files"].items():  # type: ignore[union-attr]
        try:
            data = (folder / name).read_bytes()
        except OSError:
            return False
        if hashlib.sha256(data).hexdigest() != meta.get("sha256"):
            return False
    return True


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
