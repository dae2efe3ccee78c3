"""Single-cache streams whose batches were recorded from the code before streams of several caches
(issue 23, at commit 1fb6635): ``tests/data/single_cache_batches.json``, compared by ``test_stream_mix``.

Each case names a cache (``bars``: ``synthetic_bars`` as the ``stream_cache`` fixture writes them;
``sample``: a short DBN sample built with ``build_cache``), the stream's settings, the epochs
streamed in-process and the ranks whose plans are recorded. A batch is recorded as the sha256 of its
tensors (``x`` and ``y`` for the synthetic cache, whose values are exact; the metadata of every
``MetaBatch``), a plan as the sha256 of its arrays. ``python -m helpers record-single PATH`` writes
the file again (only ever from the code the record is meant to pin).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["CASES", "RECORD", "batch_digests", "plan_digest", "record", "recorded_caches"]

RECORD = Path(__file__).resolve().parent.parent / "data" / "single_cache_batches.json"
SAMPLE_BUILD = {"split": "train=0.7,val=0.15,test=0.15", "shard_rows": 1024, "chunk_rows": 128, "progress": False}
META = ("index", "symbol", "time", "target_time")

CASES: dict[str, dict[str, Any]] = {
    "bars-train-meta": {
        "cache": "bars",
        "kw": {"seq_len": 9, "split": "train", "batch_size": 50, "meta": True},
        "epochs": [0, 1],
        "plans": [[1, 3, []], [0, 2, [[3, 4]]]],
    },
    "bars-all-xy-horizons": {
        "cache": "bars",
        "kw": {"seq_len": 10, "horizon": [1, 3], "split": "all", "batch_size": 64, "seed": 5, "mix": 2},
        "epochs": [0],
        "plans": [[2, 3, []]],
    },
    "bars-val-stride-unshuffled": {
        "cache": "bars",
        "kw": {"seq_len": 7, "stride": 3, "split": "val", "batch_size": 16, "drop_last": True, "shuffle": False},
        "epochs": [0],
        "plans": [[1, 2, []]],
    },
    "sample-train-meta": {
        "cache": "sample",
        "kw": {"seq_len": 60, "split": "train", "batch_size": 256, "seed": 3, "meta": True},
        "epochs": [0, 2],
        "plans": [[1, 2, []], [1, 3, [[2, 5]]]],
    },
    "sample-val-columns": {
        "cache": "sample",
        "kw": {
            "seq_len": 30,
            "split": "val",
            "batch_size": 100,
            "features": ["log_return", "log_range"],
            "target": ["log_return"],
            "meta": True,
            "mix": 1,
        },
        "epochs": [0],
        "plans": [],
    },
}


def _sha(arrays: list[Any]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a.numpy() if hasattr(a, "numpy") else a)
        h.update(str((a.dtype, a.shape)).encode())
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def batch_digests(batches: Any, values: bool) -> list[str]:
    """Per batch, the sha256 of its metadata (``MetaBatch``), and of ``x`` and ``y`` with ``values``."""
    out = []
    for b in batches:
        parts = [getattr(b, name) for name in META] if hasattr(b, "target_time") else []
        out.append(_sha(([b[0], b[1]] if values else []) + parts))
    return out


def plan_digest(plan: Any) -> str:
    """The sha256 of a plan's arrays and counts."""
    fields = ("shards", "lo", "hi", "pool_bounds", "pool_key", "pool_from", "pool_to", "batch_bounds")
    return _sha([getattr(plan, f) for f in fields] + [np.array([plan.n_windows, plan.dropped])])


def recorded_caches(root: Path) -> dict[str, Any]:
    """The two caches of the record, written under ``root``."""
    from helpers import make_cache, synthetic_bars
    from shardcache.ingest.builder import build_cache
    from shardcache.ingest.sample import make_sample

    bars = synthetic_bars(6000, 5, n_symbols=3, seed=7, shard_rows=512)
    files = make_sample(root / "dbn", days=4, seed=1)
    return {
        "bars": make_cache(root / "bars.zarr", bars, shard_rows=512, chunk_rows=128),
        "sample": build_cache(files, root / "sample.zarr", workers=1, **SAMPLE_BUILD),
    }


def case_digests(cache: Any, case: dict[str, Any]) -> dict[str, Any]:
    """What the record holds of one case: each epoch's batch digests, each plan's digest."""
    from shardcache.read.stream import WindowStream

    out: dict[str, Any] = {"epochs": {}, "plans": []}
    values = case["cache"] == "bars"
    with WindowStream(cache, **case["kw"]) as stream:
        for epoch in case["epochs"]:
            stream.set_epoch(epoch)
            out["epochs"][str(epoch)] = batch_digests(stream, values)
        for rank, world, history in case["plans"]:
            old = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
            os.environ.update(RANK=str(rank), WORLD_SIZE=str(world))
            try:
                if history:
                    stream.load_state_dict({**stream.state_dict(), "epoch": 1, "history": history})
                out["plans"].append(plan_digest(stream.plan() if history else stream.plan(1)))
            finally:
                for k, v in old.items():
                    os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return out


def record(root: Path, path: Path = RECORD) -> None:
    """Write the record of every case (the caches are made under ``root``)."""
    caches = recorded_caches(root)
    data = {name: case_digests(caches[case["cache"]], case) for name, case in CASES.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
