"""Resumable build state: the staging folder, what is finished, and the atomic swap into place.

``OUT.staging`` (for an object store, under the temp directory) holds ``state.json``, the spills, ``done/``
(a marker per finished task, written after its outputs) and, locally, ``cache.zarr/``; every file is renamed
into place, so a killed build resumes with only the missing tasks. A lock refuses a second build of ``OUT``.
A local cache is renamed (or ``renameat2``-swapped) onto ``OUT`` once complete; an object store is written in
place, its manifest last. ``--overwrite`` replaces only a shardcache cache (``RULES``).
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
import shutil
import tempfile
import threading
import typing
from collections.abc import Callable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CacheError, ShardcacheError, SourceError, StoreError, one_line
from ..format.cache import Cache
from ..format.layout import ATTR, FORMAT_VERSION, open_group
from ..format.manifest import marked_complete
from ..format.paths import is_local, local_path
from ..format.remote import filesystem
from . import outputs
from .markers import SUFFIXES, Unreadable, decode, encode
from .tasks import release_memory, run_tasks

__all__ = ["RULES", "Marked", "Staging", "decide", "digest", "fingerprint", "prepare", "refusal"]

log = logging.getLogger("shardcache")
STATE = "state.json"
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def fingerprint(sources: Sequence[Any], options: dict[str, Any], version: str) -> dict[str, Any]:
    """What must not change between a build and its resume: inputs (``Source.describe``), options, versions."""
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
    """A task ``(i, job)`` (or ``((i, job), shared)``) that saves ``fn(job)`` (``fn(shared, job)``) as a marker,
    then runs ``then(job)``, which may delete inputs only an unfinished task needs (picklable for dask)."""

    fn: Callable[..., Any]
    root: str
    prefix: str
    then: Callable[[Any], None] | None = None

    def __call__(self, item: tuple[int, Any], *shared: Any) -> Any:
        i, job = item
        result = self.fn(*shared, job)
        _write_marker(_marker(self.root, self.prefix, i), result)
        if self.then is not None:
            self.then(job)
        release_memory()
        return result


def _marker(root: str, prefix: str, i: int | None) -> str:
    """A marker's path less its suffix (``.json`` or ``.npz``: ``markers.encode`` picks it)."""
    return os.path.join(root, "done", prefix if i is None else f"{prefix}-{i:06d}")


def _write_marker(base: str, value: Any) -> None:
    suffix, data = encode(value)
    _write_atomic(base + suffix, data)
    for other in SUFFIXES:
        if other != suffix:
            _unlink(base + other)


def _read_marker(base: str, kind: Any) -> Any:
    """The value recorded at ``base``, or None: absent, damaged or not a ``kind`` all mean unfinished."""
    for suffix in SUFFIXES:
        try:
            with open(base + suffix, "rb") as fh:
                return decode(fh.read(), kind)
        except (OSError, Unreadable):
            continue
    return None


def _returns(fn: Callable[..., Any]) -> Any:
    """``fn``'s annotated return type: what its markers are read back as (Any if unannotated)."""
    try:
        return typing.get_type_hints(fn).get("return", Any)
    except (TypeError, NameError):
        return Any


class Staging:
    """One build's staging folder, locked against a second build of the same output."""

    def __init__(self, root: str, out: str, state: dict[str, Any], lock_fd: int) -> None:
        self.root, self.out, self.state, self._lock_fd = root, out, state, lock_fd
        self.local = is_local(out)
        self.cache_path = os.path.join(root, "cache.zarr") if self.local else out
        self.resumed = False
        self.written = False  # the cache's shards are all written: a failure after keeps the folder
        self.strays = False  # a killed write (a resumed run's, a lost worker's) may have left temporary files

    @property
    def replace(self) -> bool:
        """Whether the build may replace an existing ``out`` (it was started with ``--overwrite``)."""
        return bool(self.state.get("overwrite"))

    # -- markers -------------------------------------------------------------------------
    def load(self, prefix: str, i: int | None = None, kind: Any = Any) -> Any:
        """Task ``prefix``-``i``'s (or step ``prefix``'s) saved result as a ``kind``; None if unfinished or damaged."""
        return _read_marker(_marker(self.root, prefix, i), kind)

    def save(self, prefix: str, value: Any) -> None:
        """Record step ``prefix`` as finished with ``value`` (data: see ``shardcache.ingest.markers``)."""
        _write_marker(_marker(self.root, prefix, None), value)

    def forget(self, prefix: str) -> None:
        """Drop the markers of every task ``prefix``-N, so they run again."""
        for path in glob.glob(os.path.join(self.root, "done", f"{glob.escape(prefix)}-*")):
            _unlink(path)

    def run(
        self,
        fn: Callable[..., Any],
        jobs: Sequence[Any],
        prefix: str,
        *,
        shared: Any = None,
        then: Callable[[Any], None] | None = None,
        weights: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """``[fn(job) for job in jobs]`` as ``tasks.run_tasks`` runs them, skipping tasks finished before a resume."""
        kind = _returns(fn)
        results = [self.load(prefix, i, kind) for i in range(len(jobs))]
        todo = [(i, job) for i, (job, r) in enumerate(zip(jobs, results)) if r is None]
        if len(todo) < len(jobs):
            log.info("%s: %d of %d already done", kwargs.get("desc", prefix), len(jobs) - len(todo), len(jobs))
        counts = None if weights is None else [weights[i] for i, _ in todo]
        if kwargs.get("client") is not None:
            self.strays = True
        done = run_tasks(Marked(fn, self.root, prefix, then), todo, shared=shared, weights=counts, **kwargs)
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
            status, seen = _out_state(self.out, None)
            if status in _NEVER_REPLACED:
                raise ShardcacheError(refusal(status, self.out, what=seen.get("what", "")))
            if not self.replace:
                raise ShardcacheError(f"{self.out}: appeared during the build; pass --overwrite to replace it")
            if not _exchange(self.cache_path, out):
                aside = os.path.join(self.root, "replaced.zarr")
                os.rename(out, aside)
                os.rename(self.cache_path, out)
        else:
            os.rename(self.cache_path, out)

    def remove(self) -> None:
        """Delete the staging folder, ``state.json`` first: a kill midway leaves a stateless folder, which the
        next build clears, never a "resumable" one whose run files are gone but some markers are not."""
        _unlink(os.path.join(self.root, STATE))
        shutil.rmtree(self.root, ignore_errors=True)
        self.release()

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run a build or append (``what``) on this folder. An expected error removes it unless it holds
        progress worth resuming (never after bad input data, which a resume would meet again); a store that
        failed after its retries, a disk error (one line) or any other failure keeps it for ``--resume``."""
        try:
            yield
        except ShardcacheError as exc:
            if (self.written or self.resumed or isinstance(exc, StoreError)) and not isinstance(exc, SourceError):
                self.release()
            else:  # bad input data: a --resume would meet it again, so nothing is kept to resume
                self.remove()
            raise
        except OSError as exc:
            self.release()
            raise ShardcacheError(
                f"{exc.filename or self.out}: {exc.strerror or exc}; the finished part is kept "
                f"in {self.root}: run again with --resume to continue"
            ) from None
        except BaseException:
            self.release()
            log.warning(
                "%s: %s stopped; the finished part is kept in %s: run again with --resume", self.out, what, self.root
            )
            raise

    def release(self) -> None:
        """Let another build of this output start."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _unlink(path: str) -> None:
    Path(path).unlink(missing_ok=True)


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


def _out_state(
    out: str, storage_options: dict[str, Any] | None, specs: Sequence[str] = (), files: Sequence[str] = ()
) -> tuple[str, dict[str, Any]]:
    """What is at ``out`` (the states ``RULES`` names), with ``{"fingerprint": ...}`` of a complete cache's
    build or ``{"what": ...}`` saying what is there; ``specs`` and ``files`` are the build's inputs."""
    if clash := outputs.input_clash(out, specs, files):
        return "input", {"what": clash}
    fs, path = filesystem(out, storage_options)
    path = path.rstrip("/") or path
    if not fs.exists(path):
        return "missing", {}
    if not fs.isdir(path):
        return "file", {"what": outputs.file_kind(fs, path)}
    try:
        return "complete", {"fingerprint": Cache(out, storage_options).manifest.build.fingerprint}
    except CacheError as exc:
        problem = one_line(exc).removeprefix(f"{out}: ")
    try:
        attrs = open_group(out, "r", storage_options).attrs.get(ATTR)
    except (OSError, ValueError, KeyError, TypeError):  # not a zarr group, or its metadata cannot be read
        attrs = None
    if isinstance(attrs, dict) and attrs:
        return ("damaged" if marked_complete(attrs) else "incomplete"), {"what": problem}
    if attrs is None and outputs.has_cache_layout(fs, path):
        return "damaged", {"what": problem}
    entries = fs.ls(path, detail=False)
    if not entries:
        return "empty", {}
    if (below := outputs.cache_below(fs, path)) is not None:
        return "parent", {"what": f"{out.rstrip('/')}/{below}"}
    return "folder", {"what": outputs.listing(entries)}


def _hold(root: str) -> tuple[int | None, bool]:
    """The lock on the staging folder ``root`` (None without a folder), and whether another build holds it."""
    while os.path.isdir(root):
        fd = os.open(root, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None, True
        with contextlib.suppress(FileNotFoundError):
            if os.stat(root).st_ino == os.fstat(fd).st_ino:
                return fd, False
        os.close(fd)  # the folder was removed (its build finished) before we held it: look again
    return None, False


def _fresh(root: str, out: str, state: dict[str, Any], fd: int | None) -> Staging:
    """An empty staging folder holding only ``state.json``, locked by ``fd`` (taken here if None)."""
    if fd is None:
        os.makedirs(root, exist_ok=True)
        fd, busy = _hold(root)
        if busy or fd is None:  # another build created it first
            raise ShardcacheError(refusal("running", out, root))
    stage = Staging(root, out, state, fd)
    try:
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        for sub in ("runs", "clusters", "done"):
            os.makedirs(os.path.join(root, sub))
        _write_atomic(os.path.join(root, STATE), json.dumps(state, indent=1, default=str).encode())
    except BaseException:
        stage.release()
        raise
    return stage


def _read_state(root: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(root, STATE)) as fh:
            state = json.load(fh)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return state if isinstance(state, dict) else None


# -- what a build does with what it finds ---------------------------------------------------------
# Columns: another build holds the folder; the kept state ("none", "same", "other", "same+replace": the
# same, started with --overwrite); what is at OUT (``_out_state``, "built": complete from these inputs and
# options); --resume; --overwrite. The first row that matches decides; None matches anything.
_KEPT = frozenset({"same", "same+replace", "other"})
_SAME = frozenset({"same", "same+replace"})
_THERE = frozenset({"built", "complete", "empty"})
_Match = bool | AbstractSet[str] | None  # a column of RULES: a value, a set of values, or anything
RULES: tuple[tuple[_Match, _Match, _Match, _Match, _Match, str], ...] = (
    # running staged                  out                                resume overwrite  outcome
    (True, None, None, None, None, "refuse:running"),
    (False, None, {"input"}, None, None, "refuse:input"),
    (False, None, {"file"}, None, None, "refuse:file"),
    (False, None, {"parent"}, None, None, "refuse:parent"),
    (False, None, {"folder"}, None, None, "refuse:folder"),
    (False, None, {"built"}, True, None, "done"),
    (False, _KEPT, None, False, False, "refuse:kept"),
    (False, {"other"}, None, True, False, "refuse:other"),
    (False, _SAME, {"missing", "incomplete"}, True, None, "resume"),
    (False, {"same+replace"}, None, True, None, "resume"),
    (False, {"same"}, None, True, True, "resume"),
    (False, {"same"}, None, True, False, "refuse:exists"),
    (False, None, {"incomplete"}, None, False, "refuse:incomplete"),
    (False, None, {"damaged"}, None, False, "refuse:damaged"),
    (False, None, _THERE, None, False, "refuse:exists"),
    (False, None, None, None, None, "fresh"),
)
_NEVER_REPLACED = frozenset({"input", "file", "parent", "folder"})  # whatever the flags
_NEVER = "--overwrite replaces only a shardcache cache: choose another --out"
_REFUSALS = {
    "running": "{out}: another build of this cache is running (it holds {root})",
    "kept": "{out}: an interrupted build is kept in {root}; pass --resume to continue it or --overwrite to start again",
    "other": "{out}: the interrupted build in {root} used other inputs or options ({why}); rerun with the same "
    "ones, or pass --overwrite to start again",
    "exists": "{out}: already exists; pass --overwrite to replace it",
    "incomplete": "{out}: an incomplete cache (its build did not finish) and no build state to resume in "
    "{root}; pass --overwrite to build it again",
    "damaged": "{out}: a shardcache cache that cannot be opened ({what}); pass --overwrite to build it again",
    "input": "{out}: {what}; a cache is never written over its inputs: choose another --out",
    "file": "{out}: {what}, not a shardcache cache; " + _NEVER,
    "parent": "{out}: a folder holding the cache {what}, not a cache itself; --overwrite replaces only a "
    "shardcache cache: pass --out {what} to replace that one, or choose another --out",
    "folder": "{out}: a folder that is not a shardcache cache ({what}); " + _NEVER,
}


def refusal(outcome: str, out: str, root: str = "", why: str = "", what: str = "") -> str:
    """The one line a ``refuse:<why>`` outcome of ``decide`` ends the build with."""
    return _REFUSALS[outcome.removeprefix("refuse:")].format(out=out, root=root, why=why, what=what)


def decide(running: bool, staged: str, out: str, resume: bool, overwrite: bool) -> str:
    """What a build does (``done``, ``resume``, ``fresh``, ``refuse:<why>``): the first ``RULES`` row that matches."""
    for *pattern, outcome in RULES:
        if all(
            p is None or (v in p if isinstance(p, (set, frozenset)) else v == p)
            for p, v in zip(pattern, (running, staged, out, resume, overwrite))
        ):
            return outcome
    raise AssertionError("RULES ends with a row that matches everything")


def prepare(
    out: str,
    storage_options: dict[str, Any] | None,
    wanted: dict[str, Any],
    *,
    resume: bool,
    overwrite: bool,
    inputs: Sequence[str] = (),
) -> Staging | Cache:
    """The staging folder for building ``out`` with fingerprint ``wanted``, or the finished cache: what
    ``RULES`` says for what is on disk (resume, start again, done, or a refusal naming the flag needed).
    ``inputs`` (the specs as given) and the files in ``wanted`` are never written over."""
    root = _root(out)
    try:
        fd, running = _hold(root)
        stage = Staging(root, out, {}, -1 if fd is None else fd)  # holds the lock until handed on
        try:
            return _act(stage, fd is not None, running, storage_options, wanted, resume, overwrite, inputs)
        except BaseException:
            stage.release()
            raise
    except OSError as exc:
        raise ShardcacheError(f"{out}: cannot write here ({exc.strerror or exc})") from None


def _act(
    held: Staging,
    locked: bool,
    running: bool,
    storage_options: dict[str, Any] | None,
    wanted: dict[str, Any],
    resume: bool,
    overwrite: bool,
    inputs: Sequence[str],
) -> Staging | Cache:
    """``prepare``'s outcome, with the staging folder's lock in ``held`` (when ``locked``)."""
    root, out = held.root, held.out
    state = _read_state(root) if locked else None
    files = [str(i[0]) for i in wanted.get("inputs", [])]
    status, seen = _out_state(out, storage_options, inputs, files)
    if status == "complete" and seen["fingerprint"] == digest(wanted):
        status = "built"
    staged = "none" if state is None else "other" if state.get("fingerprint") != wanted else "same"
    if state is not None and staged == "same" and state.get("overwrite"):
        staged = "same+replace"
    outcome = decide(running, staged, status, resume, overwrite)
    if outcome.startswith("refuse:"):
        why = _differences(state.get("fingerprint", {}), wanted) if state else ""
        raise ShardcacheError(refusal(outcome, out, root, why, seen.get("what", "")))
    if outcome == "done":
        if locked:  # killed while cleaning up after publishing
            held.remove()
        log.info("%s: already built from these inputs and options; nothing to resume", out)
        return Cache(out, storage_options)
    fd, held._lock_fd = held._lock_fd, -1  # handed on to the folder returned
    if outcome == "fresh":
        return _fresh(root, out, {"fingerprint": wanted, "overwrite": overwrite}, None if fd < 0 else fd)
    replace = staged == "same+replace" or overwrite or status == "incomplete"
    damaged = _damaged(root)
    if damaged:  # a task that consumed its inputs (a merge) cannot run again alone: start again
        log.warning(
            "%s: %d damaged marker(s) in %s (first %s); starting the build again", out, len(damaged), root, damaged[0]
        )
        return _fresh(root, out, {"fingerprint": wanted, "overwrite": replace}, fd)
    assert state is not None  # every "resume" row of RULES needs a kept build's state
    stage = Staging(root, out, {**state, "overwrite": replace}, fd)
    stage.resumed = True
    stage.strays = True
    log.info("%s: resuming the interrupted build in %s", out, root)
    return stage


def _damaged(root: str) -> list[str]:
    """The markers in ``root/done`` that do not read back as data with a matching digest."""
    done = os.path.join(root, "done")
    bad = []
    for name in sorted(os.listdir(done)) if os.path.isdir(done) else []:
        if not name.endswith(SUFFIXES):
            continue  # not a marker name (an old build's .pkl, say): never read
        try:
            with open(os.path.join(done, name), "rb") as fh:
                decode(fh.read())
        except (OSError, Unreadable):
            bad.append(name)
    return bad
