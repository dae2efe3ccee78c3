"""The private parts of zarr and torch that shardcache uses, each behind one adapter module
(``shardcache/format/zarr_adapter.py``, ``shardcache/read/torch_adapter.py``): the installed
versions lie in the range each was tested for, and each private call still does what it is used for.

When zarr or torch moves past ``TESTED``, the version test fails first and names the module to
check: read its docstring, check each call against the library's changes, run these tests, then
widen ``TESTED``."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest
import torch
import zarr
from torch.utils.data import DataLoader, Dataset

from shardcache.format import zarr_adapter
from shardcache.read import torch_adapter


def _release(version: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the leading numbers of a version."""
    return tuple(int(p) for p in re.match(r"\d+(?:\.\d+)*", version).group().split("."))


@pytest.mark.parametrize(
    "library, module",
    [(zarr, zarr_adapter), (torch, torch_adapter)],
    ids=["zarr", "torch"],
)
def test_the_installed_version_is_one_the_adapter_was_tested_for(library, module):
    first, past = module.TESTED
    have = _release(library.__version__)
    assert first <= have < past, (
        f"{library.__name__} {library.__version__} is outside {'.'.join(map(str, first))} up to (not including) "
        f"{'.'.join(map(str, past))}, the versions {module.__name__} was written and tested for: check each private "
        f"call it makes (its docstring lists them) against {library.__name__}'s changes, run tests/test_adapters.py, "
        "then widen TESTED"
    )


def test_zarr_sync_and_the_async_group_behind_a_group():
    root = zarr.open_group("memory://adapter-test", mode="w", zarr_format=3)
    group = zarr_adapter.async_group(root)
    assert isinstance(group, zarr.AsyncGroup) and group.store_path == root.store_path

    async def make() -> list[str]:
        await asyncio.gather(*(group.create_array(f"a{i}", shape=(3,), dtype="int64") for i in range(4)))
        return sorted([k async for k in group.array_keys()])

    assert zarr_adapter.sync(make()) == ["a0", "a1", "a2", "a3"]
    assert sorted(root.array_keys()) == ["a0", "a1", "a2", "a3"]  # the sync group sees what the async one made
    meta = zarr_adapter.ArrayV3Metadata.from_dict(root["a1"].metadata.to_dict())
    assert meta.shape == (3,) and meta.encode_chunk_key((0,)) == "c/0"


class _Three(Dataset):  # type: ignore[type-arg]
    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int) -> int:
        return i


def test_torch_shared_storage_and_stopping_a_loaders_workers():
    storage = torch_adapter.new_shared(64)
    assert isinstance(storage, torch.UntypedStorage) and storage.is_shared() and storage.nbytes() == 64
    t = torch_adapter.in_shared_memory(torch.zeros(4))
    assert t.is_shared() and np.array_equal(t.numpy(), np.zeros(4))
    it = iter(DataLoader(_Three(), num_workers=2, persistent_workers=True))
    assert next(it).item() == 0
    workers = list(it._workers)
    assert workers and all(w.is_alive() for w in workers)
    torch_adapter.shutdown_workers(it)
    for w in workers:
        w.join(timeout=30)
    assert not any(w.is_alive() for w in workers)
