"""DDP launched by ``torch.multiprocessing.spawn`` with the stream made before ``init_process_group``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch.multiprocessing as mp
from helpers import brute_starts
from helpers.stream import ddp_stream_made_before_init

from shardcache.read.stream import WindowStream


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_are_disjoint_and_cover_the_epoch(monkeypatch, tmp_path, stream_bars, stream_cache, world):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    stream = WindowStream(stream_cache, 9, split="train", batch_size=50, meta=True)  # no process group yet
    assert (stream.rank, stream.world) == (0, 1)
    mp.spawn(
        ddp_stream_made_before_init,
        args=(world, stream, str(tmp_path / "init"), str(tmp_path)),
        nprocs=world,
        join=True,
    )
    got = [np.load(tmp_path / f"rank{r}.npy") for r in range(world)]
    meta = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    ref = brute_starts(stream_bars, 9, 1, 1, "train")
    assert [m["rank_world"] for m in meta] == [[r, world] for r in range(world)]
    assert len(set(meta[0]["all"])) == 1  # equal shares
    for g in got:
        assert np.array_equal(g[0], g[1])  # the spawned DataLoader worker knew its rank too
    union = np.concatenate([g[0] for g in got])
    assert len(np.unique(union)) == len(union) == len(ref) - len(ref) % world  # disjoint
    assert np.isin(union, ref).all()  # and covering: all but the fewer-than-world dropped
