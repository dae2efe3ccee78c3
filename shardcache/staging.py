"""Resumable build state: the staging folder, what is finished, and the atomic swap into place.

A build keeps everything it has not yet published in one staging folder, ``OUT.staging``
beside a local ``OUT`` (a private folder under the temp directory for object-store
outputs)::

    OUT.staging/
      state.json     what the build is: inputs (path, size, mtime), options, format version
      runs/          stage 1 spills, clusters/  stage 2 spills
      done/          one pickle per finished task (scan-000003.pkl, merge-..., stats-..., write-...)
      cache.zarr/    the cache being written (local outputs only)

``state.json``, the markers and every zarr object are written to a temporary name and
renamed, and a task's marker is written after its outputs (a merge deletes its input runs
only after its marker), so a build killed at any moment (SIGKILL included) leaves only
markers of finished tasks and every input an unfinished one needs. ``--resume`` with the
same inputs and options loads the markers and runs only the missing tasks; the result is
the same, array for array, as an uninterrupted build.

Publishing (local paths): the complete ``cache.zarr`` is renamed onto ``OUT`` atomically;
an existing ``OUT`` (``--overwrite``) is swapped with it in one ``renameat2(RENAME_EXCHANGE)``
where the kernel and filesystem offer it (else two renames, with a moment where ``OUT`` is
absent), and only then deleted. A reader opening ``OUT`` therefore sees the old complete
cache or the new one, never a partial one; ``Cache`` notices a swap under an open handle.
Object stores have no rename: there the cache is written in place and its manifest, marked
complete, is the build's last write, so readers refuse it until then (``--overwrite``
deletes the old cache first).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import glob
import hashlib
import json
import logging
import os
import pickle
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec

from .errors import CacheError, ShardcacheError
from .store import ATTR, FORMAT_VERSION, Cache, open_group
from .tasks import release_memory, run_tasks

__all__ = ["Marked", "Staging", "digest", "fingerprint", "is_local", "local_path", "prepare"]

log = logging.getLogger("shardcache")
STATE = "state.json"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def is_local(url: str) -> bool:
    """Whether ``url`` is a path on this machine (a plain path or ``file://``)."""
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    """The filesystem path of a local ``url``."""
    return url[len("file://") :] if url.startswith("file://") else url


def fingerprint(sources: Sequence[Any], options: dict[str, Any], version: str) -> dict[str, Any]:
    """What must not change between a build and its resume: inputs (path, size, mtime or object
    version, from ``Source.describe``), options and versions."""
    inputs = []
    for src in sources:
        d = src.describe()
        path = d["path"] if "://" in d["path"] else os.path.abspath(d["path"])
        inputs.append([path, d.get("size"), d.get("mtime", d.get("version"))])
    return {"format_version": FORMAT_VERSION, "shardcache": version, "inputs": inputs, "options": options}


def digest(state: dict[str, Any]) -> str:
    """A short stable hash of a fingerprint, recorded in the manifest."""
    text = json.dumps(state, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary name, so ``path`` is whole or absent."""
    tmp = f"{path}.tmp-{os.getpid()}-{threading.get_ident()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The first few fingerprint differences, for a person."""
    out = []
    for key in ("format_version", "shardcache"):
        if old.get(key) != new.get(key):
            out.append(f"{key} {old.get(key)} -> {new.get(key)}")
    oi = {p: (s, m) for p, s, m in old.get("inputs", [])}
    ni = {p: (s, m) for p, s, m in new.get("inputs", [])}
    out += [f"input {p} removed" for p in oi if p not in ni]
    out += [f"input {p} added" for p in ni if p not in oi]
    out += [f"input {p} changed (size or mtime)" for p in ni if p in oi and oi[p] != ni[p]]
    oo, no = old.get("options", {}), new.get("options", {})
    out += [f"{k}={oo.get(k)!r} -> {no.get(k)!r}" for k in sorted(set(oo) | set(no)) if oo.get(k) != no.get(k)]
    return ", ".join(out[:4]) + (f" and {len(out) - 4} more" if len(out) > 4 else "")


@dataclass(frozen=True)
class Marked:
    """A task that saves its result as a marker once it returns (picklable for dask workers).

    ``then(job)`` runs after the marker is written: it may delete inputs that only an
    unfinished task still needs.
    """

    fn: Callable[[Any], Any]
    root: str
    prefix: str
    then: Callable[[Any], None] | None = None

    def __call__(self, item: tuple[int, Any]) -> Any:
        i, job = item
        result = self.fn(job)
        _write_atomic(_marker(self.root, self.prefix, i), pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
        if self.then is not None:
            self.then(job)
        release_memory()
        return result


def _marker(root: str, prefix: str, i: int | None) -> str:
    return os.path.join(root, "done", f"{prefix}.pkl" if i is None else f"{prefix}-{i:06d}.pkl")


class Staging:
    """One build's staging folder, locked against a second build of the same output."""

    def __init__(self, root: str, out: str, state: dict[str, Any], lock_fd: int) -> None:
        self.root, self.out, self.state, self._lock_fd = root, out, state, lock_fd
        self.local = is_local(out)
        self.cache_path = os.path.join(root, "cache.zarr") if self.local else out
        self.resumed = False
        self.written = False  # the cache's shards are all written: a failure after keeps the folder

    @property
    def replace(self) -> bool:
        """Whether the build may replace an existing ``out`` (it was started with ``--overwrite``)."""
        return bool(self.state.get("overwrite"))

    # -- markers -------------------------------------------------------------------------
    def load(self, prefix: str, i: int | None = None) -> Any:
        """The saved result of task ``prefix``-``i`` (or of step ``prefix``), or None if unfinished."""
        try:
            with open(_marker(self.root, prefix, i), "rb") as fh:
                return pickle.load(fh)
        except FileNotFoundError:
            return None
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError):
            return None  # unreadable: the task runs again

    def save(self, prefix: str, value: Any) -> None:
        """Record step ``prefix`` as finished with ``value``."""
        _write_atomic(_marker(self.root, prefix, None), pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def forget(self, prefix: str) -> None:
        """Drop the markers of every task ``prefix``-N, so they run again."""
        for path in glob.glob(os.path.join(self.root, "done", f"{glob.escape(prefix)}-*.pkl")):
            _unlink(path)

    def run(self, fn: Callable[[Any], Any], jobs: Sequence[Any], prefix: str, *,
            then: Callable[[Any], None] | None = None, **kwargs: Any) -> list[Any]:
        """``[fn(job) for job in jobs]`` as dask tasks, skipping tasks finished before a resume."""
        results = [self.load(prefix, i) for i in range(len(jobs))]
        todo = [(i, job) for i, (job, r) in enumerate(zip(jobs, results)) if r is None]
        if len(todo) < len(jobs):
            log.info("%s: %d of %d already done", kwargs.get("desc", prefix), len(jobs) - len(todo), len(jobs))
        done = run_tasks(Marked(fn, self.root, prefix, then), todo, **kwargs)
        for (i, _), r in zip(todo, done):
            results[i] = r
        return results

    # -- end of a build ------------------------------------------------------------------
    def publish(self) -> None:
        """Move the complete cache to ``out`` (local outputs; object stores were written in place)."""
        if not self.local:
            return
        out = local_path(self.out).rstrip("/")
        if os.path.lexists(out):
            if not self.replace:
                raise ShardcacheError(f"{self.out}: appeared during the build; pass --overwrite to replace it")
            if not _exchange(self.cache_path, out):
                aside = os.path.join(self.root, "replaced.zarr")
                os.rename(out, aside)
                os.rename(self.cache_path, out)
        else:
            os.rename(self.cache_path, out)

    def remove(self) -> None:
        """Delete the staging folder: everything but ``state.json`` first, so a kill midway leaves
        either a resumable folder or one without state (treated as junk)."""
        for name in os.listdir(self.root) if os.path.isdir(self.root) else []:
            path = os.path.join(self.root, name)
            if name == STATE:
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                _unlink(path)
        _unlink(os.path.join(self.root, STATE))
        shutil.rmtree(self.root, ignore_errors=True)
        self.release()

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run a build or append (``what``) on this folder. An expected error (``ShardcacheError``)
        removes the folder unless it holds progress worth resuming; a disk error becomes one line
        and any other failure (a kill, a bug) keeps the folder for ``--resume``."""
        try:
            yield
        except ShardcacheError:
            if self.written or self.resumed:
                self.release()
            else:
                self.remove()
            raise
        except OSError as exc:
            self.release()
            raise ShardcacheError(f"{exc.filename or self.out}: {exc.strerror or exc}; the finished part is kept "
                                  f"in {self.root}: run again with --resume to continue") from None
        except BaseException:
            self.release()
            log.warning("%s: %s stopped; the finished part is kept in %s: run again with --resume", self.out,
                        what, self.root)
            raise

    def release(self) -> None:
        """Let another build of this output start."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically with ``renameat2(RENAME_EXCHANGE)``; False where unsupported."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), b)


def _root(out: str) -> str:
    if is_local(out):
        return local_path(out).rstrip("/") + ".staging"
    key = hashlib.sha256(out.encode()).hexdigest()[:16]
    return os.path.join(tempfile.gettempdir(), f"shardcache-staging-{key}")


def _out_state(out: str, storage_options: dict | None) -> tuple[str, dict[str, Any]]:
    """``missing``, ``complete`` (with its manifest), ``incomplete`` (a cache whose build did not
    finish) or ``other`` (anything else at that path)."""
    fs, path = fsspec.core.url_to_fs(out, **(storage_options or {}))
    if not fs.exists(path):
        return "missing", {}
    try:
        return "complete", Cache(out, storage_options).manifest
    except CacheError:
        pass
    try:
        attrs = dict(open_group(out, "r", storage_options).attrs.get(ATTR) or {})
    except Exception:  # not a zarr group at all
        return "other", {}
    return ("incomplete", attrs) if attrs and not attrs.get("complete") else ("other", {})


def _lock(root: str, out: str) -> int:
    fd = os.open(root, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ShardcacheError(f"{out}: another build of this cache is running (it holds {root})") from None
    return fd


def _fresh(root: str, out: str, state: dict[str, Any]) -> Staging:
    """An empty staging folder holding only ``state.json``."""
    os.makedirs(root, exist_ok=True)
    fd = _lock(root, out)
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    for sub in ("runs", "clusters", "done"):
        os.makedirs(os.path.join(root, sub))
    _write_atomic(os.path.join(root, STATE), json.dumps(state, indent=1, default=str).encode())
    return Staging(root, out, state, fd)


def _read_state(root: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(root, STATE)) as fh:
            return json.load(fh)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def prepare(out: str, storage_options: dict | None, wanted: dict[str, Any], *,
            resume: bool, overwrite: bool) -> Staging | Cache:
    """The staging folder for building ``out`` with fingerprint ``wanted``, or the finished cache.

    Decides from what is on disk: continue an interrupted build (``resume``), start again
    (``overwrite``), or refuse with a message that says which flag is needed. A ``resume``
    of a build that already finished returns its cache.
    """
    root = _root(out)
    try:
        staged = _read_state(root)
        status, manifest = _out_state(out, storage_options)
        mine = manifest.get("build", {}).get("fingerprint") == digest(wanted)
        if resume and status == "complete" and mine:
            if os.path.isdir(root):  # killed while cleaning up after publishing
                Staging(root, out, staged or {}, _lock(root, out)).remove()
            log.info("%s: already built from these inputs and options; nothing to resume", out)
            return Cache(out, storage_options)
        if staged is not None and not overwrite:
            if not resume:
                raise ShardcacheError(
                    f"{out}: an interrupted build is kept in {root}; pass --resume to continue it "
                    "or --overwrite to start again")
            if staged.get("fingerprint") != wanted:
                raise ShardcacheError(
                    f"{out}: the interrupted build in {root} used other inputs or options "
                    f"({_differences(staged.get('fingerprint', {}), wanted)}); rerun with the same "
                    "ones, or pass --overwrite to start again")
        if staged is not None and staged.get("fingerprint") == wanted and resume:
            replace = bool(staged.get("overwrite") or overwrite or status == "incomplete")
            stage = Staging(root, out, {**staged, "overwrite": replace}, _lock(root, out))
            stage.resumed = True
            if status != "missing" and not stage.replace:
                stage.release()
                raise ShardcacheError(f"{out}: already exists; pass --overwrite to replace it")
            log.info("%s: resuming the interrupted build in %s", out, root)
            return stage
        if status == "incomplete" and not overwrite:
            raise ShardcacheError(
                f"{out}: an incomplete cache (its build did not finish) and no build state to resume "
                f"in {root}; pass --overwrite to build it again")
        if status != "missing" and not overwrite:
            raise ShardcacheError(f"{out}: already exists; pass --overwrite to replace it")
        return _fresh(root, out, {"fingerprint": wanted, "overwrite": overwrite})
    except OSError as exc:
        raise ShardcacheError(f"{out}: cannot write here ({exc.strerror or exc})") from None
