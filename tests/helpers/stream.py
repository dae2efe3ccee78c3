"""Helpers of the stream tests: window start rows from a batch's metadata, whatever the format."""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "check_windows",
    "ddp_mix_rank",
    "ddp_stream_made_before_init",
    "keys_of",
    "rows_of",
    "spy_block_reads",
    "window_rows",
]


def spy_block_reads(monkeypatch, on_block) -> None:
    """Call ``on_block(cache, start, stop)`` before every block a ``Cache`` reads, one at a time
    (``read_rows``) or many at once (``read_many``, what a reader of small symbols' shards calls)."""
    from shardcache.format.cache import Cache

    one, many = Cache.read_rows, Cache.read_many

    def read_rows(self, start, stop, out=None, **kw):
        on_block(self, int(start), int(stop))
        return one(self, start, stop, out, **kw)

    def read_many(self, starts, stops, outs, **kw):
        for a, b in zip(np.asarray(starts).tolist(), np.asarray(stops).tolist()):
            on_block(self, a, b)
        return many(self, starts, stops, outs, **kw)

    monkeypatch.setattr(Cache, "read_rows", read_rows)
    monkeypatch.setattr(Cache, "read_many", read_many)


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


def keys_of(batches) -> np.ndarray:
    """Each window of ``MetaBatch``es as ``(source, symbol, row in that symbol's arrays)``, int64 ``[n, 3]``."""
    parts = [np.column_stack([b.source.numpy(), b.index.numpy()]) for b in batches]
    return np.concatenate(parts) if parts else np.zeros((0, 3), np.int64)


def check_windows(caches, batches, seq_len: int) -> int:
    """Every window's ``x`` and ``time`` are its cache's bars as plain zarr reads them (``source`` names
    the cache, ``index`` the symbol and row); the number of windows checked."""
    n = 0
    stored: dict = {}
    for b in batches:
        for i, (k, sym, row) in enumerate(keys_of([b]).tolist()):
            if (k, sym) not in stored:
                cache = caches[k]
                stored[(k, sym)] = (cache.array(sym, "features")[...], cache.array(sym, "time")[...])
            feats, times = stored[(k, sym)]
            assert np.array_equal(b.x[i].numpy(), feats[row : row + seq_len]), (k, sym, row)
            assert int(b.time[i]) == int(times[row + seq_len - 1])
            n += 1
    return n


def ddp_mix_rank(rank: int, world: int, caches, configs: list[dict], init_file: str, out_dir: str, stop: int) -> None:
    """A gloo rank streaming one epoch of each stream of several caches in ``configs`` (made here, after
    ``init_process_group``) through a ``loader(1)``: resumed from ``state{i}.json`` in ``out_dir`` when
    there is one, else whole, rank 0 saving the ``state_dict`` after batch ``stop``. Saves each
    epoch's window keys (``keys_of``) and the batch counts of every rank."""
    import json
    import os

    import torch.distributed as dist

    from shardcache.read.stream import WindowStream

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for i, kwargs in enumerate(configs):
            with WindowStream(caches, meta=True, **kwargs) as stream:
                saved = os.path.join(out_dir, f"state{i}.json")
                resume = os.path.exists(saved)
                if resume:
                    with open(saved) as f:
                        stream.load_state_dict(json.load(f))
                got = []
                for b in stream.loader(1):
                    got.append(b)
                    if len(got) == stop and not resume and rank == 0:
                        with open(saved, "w") as f:
                            json.dump(stream.state_dict(), f)
                counts = [None] * world
                dist.all_gather_object(counts, len(got))
                np.save(os.path.join(out_dir, f"c{i}-w{world}-rank{rank}.npy"), keys_of(got))
                with open(os.path.join(out_dir, f"c{i}-w{world}-rank{rank}.json"), "w") as f:
                    json.dump({"all": counts, "n_batches": stream.n_batches}, f)
    finally:
        dist.destroy_process_group()
