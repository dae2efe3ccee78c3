"""Commands run in a new interpreter by ``helpers.run_helper``: ``python -m helpers COMMAND ARGS...``."""

from __future__ import annotations

import json
import sys

import numpy as np

from shardcache.format.cache import Cache


def _resume(cache_path: str, state_file: str, workers: int, out: str, kwargs: dict) -> None:
    """Load a saved state into a fresh stream and save the indices of the rest of the epoch."""
    import torch

    from helpers.stream import rows_of
    from shardcache.read.stream import WindowStream

    with open(state_file) as f:
        state = json.load(f)
    with WindowStream(cache_path, meta=True, **kwargs) as ds:
        ds.load_state_dict(state)
        ds.set_epoch(state["epoch"])
        idx = rows_of(ds.cache, ds.loader(workers))
        np.save(out, torch.cat(idx).numpy() if idx else np.zeros(0, np.int64))


def _stream_rss(cache_path: str, limit: int, out: str, kwargs: dict) -> None:
    """Peak RSS growth while streaming ``limit`` batches (the stream's plan included)."""
    import psutil

    from shardcache.read.stream import WindowStream

    proc = psutil.Process()
    cache = Cache(cache_path)
    base = peak = proc.memory_info().rss
    ds = WindowStream(cache, **kwargs)
    n = 0
    for i, (x, y) in enumerate(ds):
        n += len(x)
        peak = max(peak, proc.memory_info().rss)
        if i + 1 == limit:
            break
    batch_bytes = x.numel() * 4 + y.numel() * 4
    with open(out, "w") as f:
        capacity = ds.capacity(ds.plan(), 1)
        json.dump({"peak": peak - base, "capacity": capacity, "batch_bytes": batch_bytes, "windows": n}, f)
    ds.close()


if __name__ == "__main__":
    cmd, rest = sys.argv[1], sys.argv[2:]
    if cmd == "resume":
        _resume(rest[0], rest[1], int(rest[2]), rest[3], json.loads(rest[4]))
    elif cmd == "record-single":
        import tempfile
        from pathlib import Path

        from helpers.recorded import record

        with tempfile.TemporaryDirectory() as tmp:
            record(Path(tmp), Path(rest[0]))
    elif cmd == "stream-rss":
        _stream_rss(rest[0], int(rest[1]), rest[2], json.loads(rest[3]))
    else:
        raise SystemExit(f"unknown command {cmd}")
