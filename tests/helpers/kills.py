"""Killing a build or an append at a chosen call: run it in a forked child that SIGKILLs itself
right before or after that call, and wait for the child (tests of resume and atomicity)."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal

from shardcache.ingest import append as append_mod
from shardcache.ingest import builder as builder_mod

__all__ = ["APPEND_KILLS", "die", "in_child", "kill_after", "kill_before"]


def in_child(target, *args, timeout: float = 120) -> int | None:
    """Run ``target(*args)`` in a forked process (cheap: no second import of torch) and wait for it."""
    proc = mp.get_context("fork").Process(target=_child, args=(target, *args))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
    return proc.exitcode


def _child(target, *args) -> None:
    import dask.threaded

    dask.threaded.default_pool = None  # the parent's worker threads do not survive the fork
    dask.threaded.pools.clear()
    target(*args)


def die() -> None:
    """SIGKILL this process: no handler, no cleanup, as an OOM kill or a power cut."""
    os.kill(os.getpid(), signal.SIGKILL)


def kill_after(obj, name: str, when) -> None:
    """Patch ``obj.name`` to be killed right after a call for which ``when(args)`` holds."""
    orig = getattr(obj, name)

    def wrapped(*args, **kwargs):
        result = orig(*args, **kwargs)
        if when(args):
            die()
        return result

    setattr(obj, name, wrapped)


def kill_before(obj, name: str, when) -> None:
    """Patch ``obj.name`` to be killed right before a call for which ``when(args)`` holds."""
    orig = getattr(obj, name)

    def wrapped(*args, **kwargs):
        if when(args):
            die()
        return orig(*args, **kwargs)

    setattr(obj, name, wrapped)


def _always(args) -> bool:
    return True


# where an append is killed: (object, function, killed after the call (else before), for which calls)
APPEND_KILLS = {
    # an append writes its shards through the builder's ``write_batches``, as a build does
    "write: a batch of tail shards rewritten, not recorded": (builder_mod, "write_shards", True, _always),
    "grow: the grown symbols' documents written, the root index not": (
        append_mod.CacheWriter,
        "write_symbols",
        True,
        _always,
    ),
    "finish: segments written, manifest not": (append_mod.CacheWriter, "finish", False, _always),
    "finish: the root index written, the manifest not": (append_mod.CacheWriter, "write_manifest", False, _always),
    "publish: complete, not swapped in": (append_mod.Staging, "publish", False, _always),
}
