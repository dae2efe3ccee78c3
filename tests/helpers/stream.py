"""Helpers of the stream tests: window start rows from a batch's metadata, whatever the format."""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["ddp_stream_made_before_init", "rows_of", "window_rows"]


def _first_rows(cache) -> np.ndarray:
    """Each symbol's first row in the cache's row space (its first segment's start)."""
    seg = np.asarray(cache.segments, dtype=np.int64)
    first = np.full(int(seg[:, 0].max()) + 1, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, seg[:, 0], seg[:, 1])
    return first


def window_rows(cache, index: torch.Tensor) -> np.ndarray:
    """Cache rows of the windows of a ``MetaBatch.index`` ([B, 2]: symbol, row in that symbol's bars)."""
    idx = index.numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
    return _first_rows(cache)[idx[:, 0]] + idx[:, 1]


def rows_of(cache, batches) -> list[torch.Tensor]:
    """Per batch, the windows' cache rows as an int64 tensor (comparable across runs)."""
    first = _first_rows(cache)
    return [torch.from_numpy(first[b.index[:, 0].numpy()] + b.index[:, 1].numpy()) for b in batches]


def ddp_stream_made_before_init(rank: int, world: int, stream, init_file: str, out_dir: str) -> None:
    """A ``torch.multiprocessing.spawn`` rank given a stream made in the parent, before any process
    group existed and with no ``RANK`` in the environment: init gloo, then stream one epoch
    in-process and one through a spawned DataLoader worker; save the windows' rows."""
    import json
    import os

    import torch.distributed as dist

    assert "RANK" not in os.environ and not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        inproc = torch.cat(rows_of(stream.cache, stream)).numpy()
        stream.set_epoch(0)
        worker = torch.cat(rows_of(stream.cache, stream.loader(1, multiprocessing_context="spawn"))).numpy()
        counts = [None] * world
        dist.all_gather_object(counts, len(inproc))
        np.save(os.path.join(out_dir, f"rank{rank}.npy"), np.stack([inproc, worker]))
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"all": counts, "rank_world": [stream.rank, stream.world]}, f)
        stream.close()
    finally:
        dist.destroy_process_group()
