"""The node-local shard cache (``shardcache.format.local_cache``) on real processes and files: each object
fetched once by one of several processes that want it at once, the shard files under the byte limit at
every moment while processes fill it, a killed fetch that blocks nobody, and a stream reading through it
(``cache_dir``, ``cache_limit``) serving exactly the batches it serves without it."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.local import peak_bytes, shard_bytes

from shardcache.errors import OptionError, OptionTypeError
from shardcache.format.local_cache import TRAILER, LocalCache, ShardCopyWarning
from shardcache.format.paths import read_options
from shardcache.read.dataset import WindowDataset
from shardcache.read.stream import WindowStream

_CTX = mp.get_context("fork")


def _payload(k: int, size: int) -> np.ndarray:
    return np.full(size, k % 251, dtype=np.uint8)


def _fetch_all(directory: str, limit: int | None, names: list[int], size: int, log: str, delay: float) -> None:
    """A process reading ``names`` through the cache, with 2 threads; each download appends a line to ``log``."""
    local = LocalCache(directory, limit)

    def download(k: int) -> np.ndarray:
        with open(log, "a") as fh:
            fh.write(f"{k}\n")
        time.sleep(delay)
        return _payload(k, size)

    def work(order: list[int]) -> None:
        for k in order:
            name = f"space/obj/c/{k}/0@1"
            got = local.get(name, lambda k=k: download(k))
            data = local.checked(name, np.fromfile(got, dtype=np.uint8)) if isinstance(got, str) else got
            assert data.tobytes() == _payload(k, size).tobytes()

    threads = [threading.Thread(target=work, args=(names[i::2],)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _fetch_in_processes(args: list[tuple]) -> None:
    """``_fetch_all`` in a process of its own for each of ``args``, all at once; each must exit 0."""
    procs = [_CTX.Process(target=_fetch_all, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0


def test_each_object_is_fetched_once_by_the_processes_that_want_it_at_once(tmp_path):
    names, log = list(range(24)), str(tmp_path / "downloads")
    _fetch_in_processes(
        [(str(tmp_path / "c"), None, names[::-1] if p % 2 else names, 1000, log, 0.02) for p in range(4)]
    )
    downloads = Path(log).read_text().split()
    assert sorted(map(int, downloads)) == names  # 4 processes x 2 threads wanted each; one fetched it
    assert LocalCache(tmp_path / "c").stored_bytes() == shard_bytes(tmp_path / "c") == 24 * (1000 + TRAILER.size)


def test_the_shard_files_stay_under_the_limit_while_processes_fill_it(tmp_path):
    folder, limit, size = tmp_path / "c", 10_500, 1000 - TRAILER.size  # each file 1,000 bytes
    with peak_bytes(folder) as peak:
        _fetch_in_processes(
            [(str(folder), limit, list(range(p * 10, p * 10 + 40)), size, os.devnull, 0) for p in range(3)]
        )
    assert 0 < peak[0] <= limit
    kept = shard_bytes(folder)
    assert kept == LocalCache(folder, limit).stored_bytes() <= limit
    assert kept == 10 * (size + TRAILER.size)  # evicted only what it had to
    assert not list(folder.rglob("*.part"))


def test_an_object_above_the_limit_is_read_but_not_kept(tmp_path):
    local = LocalCache(tmp_path / "c", 100)
    got = local.get("s/a@1", lambda: _payload(1, 500))
    assert isinstance(got, np.ndarray) and got.nbytes == 500
    assert shard_bytes(tmp_path / "c") == 0 and local.stored_bytes() == 0
    assert local.get("s/missing@1", lambda: None) is None  # an absent object stays absent


def _hang_while_fetching(directory: str, started: mp.Event) -> None:
    def download() -> np.ndarray:
        started.set()
        time.sleep(60)
        return _payload(0, 10)

    local = LocalCache(directory, 50)
    local._admit("s/dead@1", 40)  # what a writer killed between its admission and its rename leaves
    local.get("s/x@1", download)


def test_a_killed_fetch_blocks_no_one_and_its_room_is_taken_back(tmp_path):
    folder = str(tmp_path / "c")
    started = _CTX.Event()
    child = _CTX.Process(target=_hang_while_fetching, args=(folder, started))
    child.start()
    assert started.wait(30)
    local = LocalCache(folder, 50)
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    got = local.get("s/x@1", lambda: _payload(7, 10))  # the dead fetch's lock is gone: this one fetches
    assert got.tobytes() == _payload(7, 10).tobytes()
    local.get("s/y@1", lambda: _payload(8, 8))  # both fit the limit of 50 once the dead writer's 40 bytes are gone
    assert local.stored_bytes() == 10 + 8 + 2 * TRAILER.size == shard_bytes(folder)


def test_a_temporary_folder_is_removed_by_close_in_its_own_process_only(tmp_path):
    local = LocalCache.temporary_dir(1000)
    local.get("s/a@1", lambda: _payload(1, 10))
    child = _CTX.Process(target=lambda: local.close())
    child.start()
    child.join(30)
    assert os.path.isdir(local.directory)  # a forked worker's close leaves it
    local.close()
    assert not os.path.exists(local.directory)
    assert local.get("s/b@1", lambda: _payload(2, 10)).tobytes() == _payload(2, 10).tobytes()  # a late reader
    assert not os.path.exists(local.directory)  # reads on, without making the folder again


KW = {"seq_len": 10, "horizon": 2, "batch_size": 64, "split": "all"}


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_through_a_bounded_local_copy_serves_the_same_batches(stream_cache, tmp_path, workers):
    with WindowStream(stream_cache, meta=True, **KW) as plain:
        want = list(plain)
    folder = tmp_path / "copy"
    limit = 3 * 512 * 5 * 4  # three of the cache's shards, decoded size
    stored = sum(f.stat().st_size for f in Path(stream_cache.url).glob("symbols/*/features/c.*.0"))
    assert stored > 2 * limit  # the split does not fit: the copy evicts as it goes
    with (
        peak_bytes(folder) as peak,
        WindowStream(stream_cache, meta=True, cache_dir=folder, cache_limit=limit, **KW) as s,
    ):
        got = list(s.loader(workers))
    assert len(got) == len(want) and all(torch.equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))
    assert 0 < peak[0] <= limit and shard_bytes(folder) <= limit
    copied = WindowDataset(stream_cache, 10, horizon=2, split="all", cache_dir=folder, cache_limit=limit)
    direct = WindowDataset(stream_cache, 10, horizon=2, split="all")
    for i in (0, 1000, len(direct) - 1):
        assert torch.equal(copied[i].x, direct[i].x) and torch.equal(copied[i].y, direct[i].y)


def test_local_copy_options_are_checked_before_the_cache_is_read(tmp_path, stream_cache):
    missing = tmp_path / "nothing-here.zarr"
    with pytest.raises(OptionError, match=r"cache_limit='lots': give bytes"):
        WindowStream(missing, 10, cache_limit="lots")
    with pytest.raises(OptionError, match=r"cache_limit=0: must be a positive number of bytes"):
        WindowStream(missing, 10, cache_limit=0)
    with pytest.raises(OptionTypeError, match=r"cache_dir=3: must be a folder path"):
        WindowStream(missing, 10, cache_dir=3)
    (tmp_path / "file").write_text("x")
    with pytest.raises(OptionError, match=r"cache_dir='.*file': is a file, not a folder"):
        WindowStream(missing, 10, cache_dir=tmp_path / "file")
    with pytest.raises(OptionError, match=r"cache_limit='1GB': bounds a node-local copy .* give cache_dir too"):
        WindowStream(stream_cache, 10, split="all", cache_limit="1GB")
    with WindowStream(stream_cache, 10, split="all") as local:
        assert local.cache.local is None  # a local cache is read in place
    with WindowStream(stream_cache, 10, split="all", cache_dir=tmp_path / "d", cache_limit="1MiB") as copied:
        assert copied.cache.local.limit == 1 << 20 and stream_cache.local is None  # a view: the given cache unchanged


def test_read_options_add_one_request_per_object_and_the_callers_options_win():
    assert read_options("s3://b/c.zarr", None) == {"max_concurrency": 1}
    assert read_options("s3://b/c.zarr", {"max_concurrency": 8, "anon": True}) == {"max_concurrency": 8, "anon": True}
    chained = read_options("simplecache::s3://b/c.zarr", {"simplecache": {"cache_storage": "/x"}, "s3": {"anon": True}})
    assert chained == {
        "simplecache": {"cache_storage": "/x"},
        "s3": {"max_concurrency": 1, "asynchronous": True, "anon": True},
    }
    assert read_options("gs://b/c.zarr", {"token": "anon"}) == {"token": "anon"}
    assert read_options("/data/c.zarr", None) is None


def test_swapped_flipped_truncated_or_emptied_copies_are_refetched_not_served(stream_cache, tmp_path):
    """The node-local copy is checked on every read (its name's stamp, its bytes' crc32c): a copy that is not
    its object's bytes is deleted and fetched again from the cache, so every batch is the cache's."""
    with WindowStream(stream_cache, meta=True, **KW) as plain:
        want = list(plain)
    folder = tmp_path / "copy"
    with WindowStream(stream_cache, meta=True, cache_dir=folder, **KW) as s:
        assert len(list(s)) == len(want)
    files = sorted(p for p in folder.rglob("c.*@*") if p.is_file())
    assert len(files) == stream_cache.n_shards
    a, b = files[0].read_bytes(), files[1].read_bytes()
    files[0].write_bytes(b), files[1].write_bytes(a)  # two valid copies swapped
    flipped = bytearray(files[2].read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF
    files[2].write_bytes(bytes(flipped))
    files[3].write_bytes(files[3].read_bytes()[:-100])  # truncated
    files[4].write_bytes(b"")  # emptied
    with pytest.warns(ShardCopyWarning) as caught, WindowStream(stream_cache, meta=True, cache_dir=folder, **KW) as s:
        got = list(s)
    assert len(got) == len(want) and all(torch.equal(x, y) for g, w in zip(got, want) for x, y in zip(g, w))
    damaged = {str(f) for f in files[:5]}
    assert {str(w.message).split(": ")[0] for w in caught} == damaged
    assert sum("another object's bytes" in str(w.message) for w in caught) == 2
    with warnings.catch_warnings():  # healed: the copies are the objects' again
        warnings.simplefilter("error", ShardCopyWarning)
        with WindowStream(stream_cache, meta=True, cache_dir=folder, **KW) as s:
            assert len(list(s)) == len(want)
    assert LocalCache(folder).stored_bytes() == shard_bytes(folder)


FULL_DISK = """
import resource, signal, sys, warnings
import torch
from shardcache.read.stream import WindowStream
from shardcache.format.local_cache import ShardCopyWarning
cache, folder = sys.argv[1], sys.argv[2]
kw = dict(seq_len=10, horizon=2, batch_size=64, split="all")
with WindowStream(cache, **kw) as plain:
    want = list(plain)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", ShardCopyWarning)
    with WindowStream(cache, cache_dir=folder, **kw) as s:
        got = list(s)
assert len(got) == len(want) and all(torch.equal(a, b) for g, w in zip(got, want) for a, b in zip(g, w))
print(len([w for w in caught if w.category is ShardCopyWarning]), str(caught[0].message) if caught else "")
"""


def test_a_folder_that_takes_no_more_bytes_reads_on_with_one_warning(stream_cache, tmp_path):
    """A full ``cache_dir`` (every write past 4 KiB fails, as on a full disk): every batch is served, from
    the cache, with one ``ShardCopyWarning`` naming the folder, never an ``OperationalError``."""
    import subprocess
    import sys

    folder = tmp_path / "full"
    proc = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(stream_cache.url), str(folder)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    count, message = proc.stdout.strip().split(" ", 1)
    assert count == "1" and message.startswith(f"{folder}: the node-local folder takes no copies ("), proc.stdout
    assert message.endswith("reading on without copying")
