"""A bounded node-local copy of shard objects, shared by every process of a node that names its folder.

One file per object (``<cache folder>/<key>@<rows>``, so a grown shard names a new file), fetched by the
process that takes its ``flock`` stripe first and read by all; a SQLite ledger deletes the oldest files
before one is admitted (a row is written before its file and a file deleted before its row), so the files
never pass ``limit``. Each file ends in a trailer (its name's blake2b, its crc32c, a magic word) checked on
every read. Needs a local filesystem with working ``flock`` and SQLite locking; docs/scaling.md has the rest.
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
    """A node-local copy could not be used: not its object's bytes (deleted and fetched again), or the folder
    takes no copies (full, read-only; reads go on without them)."""


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
    """Whether process ``pid`` runs on this node (a file it writes is not evicted, a ring it maps not unlinked)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _drop(db: sqlite3.Connection, name: str) -> None:
    """Delete ``name``'s ledger row, if there is one, and its size from the total."""
    row = db.execute("SELECT size FROM files WHERE name = ?", (name,)).fetchone()
    if row is not None:
        db.execute("DELETE FROM files WHERE name = ?", (name,))
        db.execute("UPDATE total SET bytes = bytes - ? WHERE id = 0", (row[0],))


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

    def path(self, name: str) -> str:
        """Where object ``name`` (``<cache folder>/<key>@<rows>``) is kept."""
        return os.path.join(self.directory, *name.split("/"))

    def get(self, name: str, download: Callable[[], np.ndarray | None]) -> str | np.ndarray | None:
        """The path of object ``name`` when a copy is kept, else its bytes from ``download()`` (kept when they
        fit; None when the object does not exist). One caller downloads a missing object, the others wait."""
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
        """The bytes of object ``name`` in ``data`` (its kept file as read); None, the file deleted, when the file
        is not that object's whole bytes."""
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

    def _lock_file(self, name: str | None) -> int:
        """An open descriptor of ``name``'s lock file (None: the ledger's); OSError when the folder takes no file."""
        stripe = int.from_bytes(hashlib.blake2b(str(name).encode(), digest_size=2).digest(), "big") % LOCKS
        folder = os.path.join(self.directory, "locks")
        os.makedirs(folder, exist_ok=True)
        return os.open(
            os.path.join(folder, "ledger" if name is None else f"{stripe:03d}"), os.O_RDWR | os.O_CREAT, 0o644
        )

    @contextlib.contextmanager
    def _locked(self, name: str | None, fd: int | None = None) -> Iterator[None]:
        """An exclusive lock of ``name``'s lock file (``fd`` when open already): one fetch of an object at a time."""
        fd = self._lock_file(name) if fd is None else fd
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # per open file: threads of one process exclude each other too
            yield
        finally:
            os.close(fd)  # releases the lock

    def _keep(self, name: str, path: str, data: np.ndarray) -> None:
        """Admit ``data`` to the ledger, write it to a part file renamed into place, then mark it ready; not kept
        when it cannot fit or be written (a full disk): the read goes on."""
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
        """This thread's connection to the ledger (a new one in a forked process); the caller holds ``_SQLITE``."""
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
        """No file is admitted to or evicted from the folder while inside (every writer of the node waits)."""
        with _SQLITE:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                db.execute("ROLLBACK")

    def _admit(self, name: str, size: int) -> bool:
        """Count ``size`` bytes for ``name``, first deleting the oldest ready files while the total would pass the
        limit; False, nothing changed, when files being written by live processes leave no room. One
        transaction: concurrent writers never overshoot together."""

        def admit(db: sqlite3.Connection) -> bool:
            _drop(db, name)  # a row whose file is gone: a write killed before its rename
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
        self._transaction(lambda db: _drop(db, name))

    def stored_bytes(self) -> int:
        """Bytes the ledger counts (every file kept, and any being written)."""
        with _SQLITE:
            return int(self._db().execute("SELECT bytes FROM total WHERE id = 0").fetchone()[0])
