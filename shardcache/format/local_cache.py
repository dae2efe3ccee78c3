"""A bounded node-local copy of shard objects, shared by every process of a node that names its folder.

``WindowStream(..., cache_dir=DIR, cache_limit="50GB")`` (LitData's ``cache_dir`` and
``max_cache_size``, Mosaic's ``local`` and ``cache_limit``) reads each shard object of a remote cache
once into ``DIR`` and every later read of it from there, in any DataLoader worker or rank of the node.

* **One file per shard object**, named by its key below a folder per cache (a digest of its URL and
  build, so a rebuilt cache never reads an older one's files) and by the rows the manifest says it
  holds (``symbols/3/features/c.0.0@300``): an append that grows a symbol's last shard names a new
  file, so a copy taken before the append is never read for rows it does not have.
* **Fetched by one, read by all**: a miss takes an exclusive ``flock`` on one of ``LOCKS`` lock files
  (by the name's hash) before it downloads; another process or thread that misses the same object
  waits on that lock, then finds the file. A lock dies with its process, so a killed fetch never
  blocks the others.
* **Bounded**: a ledger (SQLite, in ``DIR/ledger.sqlite3``: one row per file, its size, whether it is
  written, its writer's pid, in insertion order, and the total) admits a file only after deleting the
  oldest written files until the total plus the new file fits ``limit``. The row is written before the
  file and a file deleted before its row, and a file being written by a live process is never
  deleted, so the shard files in ``DIR`` never hold more than ``limit`` bytes, whichever process
  writes. An object larger than the limit (or than the room left by files being written) is read
  without being kept. A file is written to ``<name>.part`` (its writer holds its lock) and renamed
  into place, so a reader sees whole files only; a killed writer's row and part file are evicted.
* **Checked on every read, healed when wrong**: a file is the object's bytes and a 16-byte trailer, the
  blake2b of its name (8 bytes), the crc32c of the bytes and a magic word. A copy whose trailer is not its
  name's (two copies swapped, or renamed), or whose bytes do not match (flipped, truncated, emptied) is
  deleted and the object fetched again, with a ``ShardCopyWarning``: the remote cache is the truth.
* A temporary folder (``LocalCache.temporary_dir``) is removed by the process that made it, on
  ``close()`` or at exit; the processes it was handed to (DataLoader workers) only use it.

The ledger's own files (a few KB a thousand shards) and the lock files are not counted in ``limit``.
A ``fork()`` waits for a ledger transaction of this process under way (a few milliseconds), so a
forked DataLoader worker never inherits SQLite's locks held by another thread.
Every process that shares a folder should give it the same limit (each enforces its own on what it
adds). Needs a local filesystem with working ``flock`` and SQLite locking (not NFS).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import sqlite3
import struct
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import google_crc32c
import numpy as np

from ..tuning import LOCKS

__all__ = ["LEDGER", "TRAILER", "LocalCache", "ShardCopyWarning", "process_alive"]

TRAILER = struct.Struct("<8sI4s")  # a kept file's last bytes: its name's blake2b, the body's crc32c, magic
_MAGIC = b"SCc1"


class ShardCopyWarning(UserWarning):
    """A node-local copy could not be used: it was not its object's bytes (deleted and fetched again), or the
    folder takes no copies (full, read-only; reads go on without them)."""


def _stamp(name: str) -> bytes:
    return hashlib.blake2b(name.encode(), digest_size=8).digest()


LEDGER = "ledger.sqlite3"
# held around every use of SQLite in this process, and by fork() (os.register_at_fork): a forked child
# (a DataLoader worker) never starts with another thread inside SQLite, whose own locks it could not take
_SQLITE = threading.Lock()
os.register_at_fork(before=_SQLITE.acquire, after_in_parent=_SQLITE.release, after_in_child=_SQLITE.release)
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS files (name TEXT PRIMARY KEY, size INTEGER NOT NULL, ready INTEGER, pid INTEGER)",
    "CREATE TABLE IF NOT EXISTS total (id INTEGER PRIMARY KEY CHECK (id = 0), bytes INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO total VALUES (0, 0)",
)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this node (a file it is writing must not be evicted; a ring it
    maps must not be unlinked)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_tree(path: str, owner: int) -> None:
    """Remove a temporary folder, in the process that made it only (a forked worker inherits the finalizer)."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


class LocalCache:
    """Shard objects kept in ``directory`` up to ``limit`` bytes (None: no limit); see the module docstring.

    Picklable: a DataLoader worker (forked or spawned) opens its own ledger connection and locks.
    """

    def __init__(self, directory: str | os.PathLike[str], limit: int | None = None) -> None:
        self.directory = os.path.abspath(os.fspath(directory))
        self.limit = limit
        self.temporary = False
        self._tls = threading.local()
        self._finalizer: Any = None
        self._warned = False  # ShardCopyWarning said once that the folder takes no copies

    @classmethod
    def temporary_dir(cls, limit: int | None) -> LocalCache:
        """A cache in a new folder under the system's temporary folder (``TMPDIR``), removed on ``close()``
        or at the exit of the process that made it."""
        local = cls(tempfile.mkdtemp(prefix="shardcache-shards-"), limit)
        local.temporary = True
        local._finalizer = weakref.finalize(local, _remove_tree, local.directory, os.getpid())
        return local

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_tls"], state["_finalizer"] = None, None  # connections and the clean-up stay in their process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._tls = threading.local()

    def __repr__(self) -> str:
        return f"LocalCache({self.directory!r}, limit={self.limit})"

    def close(self) -> None:
        """Remove a temporary folder (in the process that made it); a named folder stays as it is."""
        if self._finalizer is not None:
            self._finalizer()

    # -- reads -------------------------------------------------------------------------------
    def path(self, name: str) -> str:
        """Where object ``name`` (``<cache folder>/<key>@<rows>``) is kept."""
        return os.path.join(self.directory, *name.split("/"))

    def get(self, name: str, download: Callable[[], np.ndarray | None]) -> str | np.ndarray | None:
        """The path of object ``name`` when a copy is kept, else its bytes from ``download()`` (kept
        when they fit; None when the object does not exist). One caller downloads a missing object,
        the others wait for it."""
        path = self.path(name)
        if os.path.isfile(path):
            return path
        if self.temporary and not os.path.isdir(self.directory):  # removed by its owner: read, do not remake it
            return download()
        try:
            fd = self._lock_file(name)
        except OSError as exc:  # no lock file can be made (a full or read-only folder): read without keeping
            self._unusable(exc)
            return download()
        with self._locked(name, fd):
            if os.path.isfile(path):  # fetched by another process or thread while this one waited
                return path
            data = download()
            if data is not None:
                self._keep(name, path, data)
            return data

    def _unusable(self, exc: BaseException) -> None:
        """Say once per process that the folder takes no copies (full, read-only): reads go on without them."""
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"{self.directory}: the node-local folder takes no copies ({exc}); reading on without copying",
                ShardCopyWarning,
                stacklevel=3,
            )

    def checked(self, name: str, data: np.ndarray) -> np.ndarray | None:
        """The bytes of object ``name`` in ``data``, its kept file as read; None, the file deleted (so the next
        ``get`` fetches it again), when the file is not that object's whole bytes."""
        why = "is damaged"
        if len(data) >= TRAILER.size:
            stamp, crc, magic = TRAILER.unpack_from(data.data, len(data) - TRAILER.size)
            body = data[: len(data) - TRAILER.size]
            if magic == _MAGIC and crc == google_crc32c.value(body):
                if stamp == _stamp(name):
                    return body
                why = "holds another object's bytes"
        warnings.warn(
            f"{self.path(name)}: the node-local copy {why}; deleted, fetched again from the cache",
            ShardCopyWarning,
            stacklevel=2,
        )
        with self._locked(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path(name))
            with contextlib.suppress(sqlite3.Error):  # a full disk: the row stays counted, which errs safe
                self._forget(name)
        return None

    # -- writes ------------------------------------------------------------------------------
    def _lock_file(self, name: str | None) -> int:
        """An open descriptor of ``name``'s lock file (None: the ledger's set-up); OSError when the folder
        takes no new file."""
        stripe = int.from_bytes(hashlib.blake2b(str(name).encode(), digest_size=2).digest(), "big") % LOCKS
        folder = os.path.join(self.directory, "locks")
        os.makedirs(folder, exist_ok=True)
        return os.open(
            os.path.join(folder, "ledger" if name is None else f"{stripe:03d}"), os.O_RDWR | os.O_CREAT, 0o644
        )

    @contextlib.contextmanager
    def _locked(self, name: str | None, fd: int | None = None) -> Iterator[None]:
        """An exclusive lock of ``name``'s lock file (``fd`` when it is open already): one fetch of an object
        at a time on the node."""
        fd = self._lock_file(name) if fd is None else fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # per open file: threads of one process exclude each other too
            yield
        finally:
            os.close(fd)  # releases the lock

    def _keep(self, name: str, path: str, data: np.ndarray) -> None:
        """Admit ``data`` to the ledger (deleting the oldest files until it fits), write it in place, then
        mark it ready. Not kept when it cannot fit, or cannot be written (a full disk): the read goes on."""
        body = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        size = int(body.nbytes) + TRAILER.size
        try:
            if (self.limit is not None and size > self.limit) or not self._admit(name, size):
                return
        except sqlite3.Error as exc:  # the ledger cannot be written (a full disk): the read goes on
            self._unusable(exc)
            return
        part = f"{path}.part"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(part, "wb") as fh:
                body.tofile(fh)
                fh.write(TRAILER.pack(_stamp(name), google_crc32c.value(body), _MAGIC))
            os.replace(part, path)
        except OSError as exc:  # a full disk: the read goes on without a copy
            with contextlib.suppress(OSError):
                os.unlink(part)
            self._unusable(exc)
            with contextlib.suppress(sqlite3.Error):
                self._forget(name)
            return
        try:
            self._transaction(lambda db: db.execute("UPDATE files SET ready = 1 WHERE name = ?", (name,)))
        except sqlite3.Error as exc:
            self._unusable(exc)

    def _db(self) -> sqlite3.Connection:
        """This thread's connection to the ledger (a new one in a forked or spawned process); the caller
        holds ``_SQLITE``."""
        conn = getattr(self._tls, "conn", None)
        if conn is None or self._tls.pid != os.getpid():
            # one process at a time: a journal mode is changed under an exclusive lock, and SQLite answers
            # "locked" at once (no waiting) to a second connection that asks for it meanwhile
            with self._locked(None):
                conn = sqlite3.connect(os.path.join(self.directory, LEDGER), timeout=120, isolation_level=None)
                conn.execute("PRAGMA journal_mode=WAL")  # readers never wait; one writer at a time
                conn.execute("PRAGMA synchronous=OFF")  # a commit survives its process (not the machine): enough
                conn.execute("BEGIN IMMEDIATE")
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.execute("COMMIT")
            self._tls.conn, self._tls.pid = conn, os.getpid()
        return conn

    def _transaction(self, body: Callable[[sqlite3.Connection], Any]) -> Any:
        """``body(db)`` inside one write transaction of the ledger (other writers wait for it)."""
        with _SQLITE:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                out = body(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return out

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No file is admitted to or evicted from the folder while inside (every writer of the node waits
        for the ledger): what the folder holds then is one moment's, e.g. to measure it."""
        with _SQLITE:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                db.execute("ROLLBACK")

    def _admit(self, name: str, size: int) -> bool:
        """Count ``size`` bytes for ``name`` (a row being written, by this process), first deleting the
        oldest ready files (a file, then its row) while the total would pass the limit; False, with
        nothing changed, when the files being written by live processes leave no room. One transaction:
        concurrent writers never overshoot together."""

        def admit(db: sqlite3.Connection) -> bool:
            old = db.execute("SELECT size FROM files WHERE name = ?", (name,)).fetchone()
            if old is not None:  # a row whose file is gone: a write killed before its rename
                db.execute("DELETE FROM files WHERE name = ?", (name,))
                db.execute("UPDATE total SET bytes = bytes - ? WHERE id = 0", (old[0],))
            total = db.execute("SELECT bytes FROM total WHERE id = 0").fetchone()[0]
            victims, freed = [], 0
            if self.limit is not None and total + size > self.limit:
                for victim, n, ready, pid in db.execute("SELECT name, size, ready, pid FROM files ORDER BY rowid"):
                    if ready or not process_alive(pid):
                        victims.append(victim)
                        freed += n
                        if total - freed + size <= self.limit:
                            break
                if total - freed + size > self.limit:
                    return False
            for victim in victims:  # the file before its row: the files never hold more than the count
                for path in (self.path(victim), f"{self.path(victim)}.part"):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
            db.executemany("DELETE FROM files WHERE name = ?", [(v,) for v in victims])
            db.execute("INSERT INTO files VALUES (?, ?, 0, ?)", (name, size, os.getpid()))
            db.execute("UPDATE total SET bytes = ? WHERE id = 0", (total - freed + size,))
            return True

        return bool(self._transaction(admit))

    def _forget(self, name: str) -> None:
        """Drop ``name``'s row (its file was not written)."""

        def forget(db: sqlite3.Connection) -> None:
            row = db.execute("SELECT size FROM files WHERE name = ?", (name,)).fetchone()
            if row is not None:
                db.execute("DELETE FROM files WHERE name = ?", (name,))
                db.execute("UPDATE total SET bytes = bytes - ? WHERE id = 0", (row[0],))

        self._transaction(forget)

    def stored_bytes(self) -> int:
        """Bytes the ledger counts (every file kept, and any being written)."""
        with _SQLITE:
            return int(self._db().execute("SELECT bytes FROM total WHERE id = 0").fetchone()[0])
