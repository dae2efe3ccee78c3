"""A stream's settings as objects (``PlanSettings``, ``LoaderSettings``, ``LocalCopy``, ``CacheSource``) or as
the keyword arguments naming their fields: the same batches either way, each checked when it is made,
and both ways for one object, or an unknown keyword, refused in one line before any cache is read."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch
from helpers import make_cache, synthetic_bars
from helpers.stream import keys_of

from shardcache import CacheSource, LoaderSettings, LocalCopy, PlanSettings, build_cache
from shardcache.errors import OptionError, OptionTypeError
from shardcache.read.stream import WindowDataset, WindowStream


def batches(stream) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with stream:
        return [(b.x.clone(), b.y.clone()) for b in stream]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(p, q) for g, w in zip(a, b) for p, q in zip(g, w))


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """Two caches with the same features, for weighted mixing (read with ``split="all"``)."""
    root = tmp_path_factory.mktemp("settings")
    return [
        make_cache(
            root / f"{k}.zarr",
            synthetic_bars(3000, 3, n_symbols=2, seed=k, shard_rows=256),
            shard_rows=256,
            chunk_rows=64,
        )
        for k in (1, 2)
    ]


def test_objects_and_their_fields_give_the_same_epoch(stream_cache):
    fields = WindowStream(stream_cache, 16, split="train", batch_size=100, seed=3, mix=2, prefetch=1, decoders=1)
    objects = WindowStream(
        stream_cache,
        16,
        split="train",
        order=PlanSettings(batch_size=100, seed=3, mix=2),
        loading=LoaderSettings(prefetch=1, decoders=1),
    )
    assert fields.order == objects.order and fields.loading == objects.loading
    assert same(batches(fields), batches(objects)) and objects.state_dict() == fields.state_dict()
    ds = WindowDataset(stream_cache, 16, split="val", local=LocalCopy())
    assert torch.equal(ds[5].x, WindowDataset(stream_cache, 16, split="val")[5].x)


def test_settings_are_checked_when_made_and_held_resolved():
    assert PlanSettings() == PlanSettings(batch_size=256, shuffle=True, seed=0, mix=4, drop_last=False)
    assert PlanSettings(batch_size=np.int64(7)).batch_size == 7
    with pytest.raises(OptionTypeError, match=r"^batch_size=2.5: expected a whole number$"):
        PlanSettings(batch_size=2.5)
    with pytest.raises(OptionError, match=r"^mix=0: must be at least 1$"):
        PlanSettings(mix=0)
    loading = LoaderSettings(memory_budget="64MiB", device="cpu")
    assert loading.memory_budget == 64 << 20 and loading.device == torch.device("cpu") and loading.prefetch == 2
    with pytest.raises(OptionError, match="memory_budget='lots'"):
        LoaderSettings(memory_budget="lots")
    assert LocalCopy(cache_limit="1GB").cache_limit == 10**9
    with pytest.raises(OptionTypeError, match="cache_dir=3: must be a folder path"):
        LocalCopy(cache_dir=3)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"order": PlanSettings(), "batch_size": 5},
            r"pass order=PlanSettings\(\.\.\.\) or its fields \(batch_size\), not both",
        ),
        (
            {"loading": LoaderSettings(), "prefetch": 1},
            r"pass loading=LoaderSettings\(\.\.\.\) or its fields \(prefetch\)",
        ),
        ({"local": LocalCopy(), "cache_dir": "x"}, r"pass local=LocalCopy\(\.\.\.\) or its fields \(cache_dir\)"),
        ({"order": {"batch_size": 5}}, r"order=\{'batch_size': 5\} is not a PlanSettings"),
        ({"batch_sise": 5}, r"got an unexpected keyword argument 'batch_sise'"),
    ],
)
def test_both_ways_or_an_unknown_keyword_is_refused_before_the_cache_is_opened(tmp_path, kwargs, message):
    missing = tmp_path / "nothing-here.zarr"
    with pytest.raises(OptionTypeError, match=rf"^WindowStream\(\)(: | ){message}"):
        WindowStream(missing, 10, **kwargs)
    if "local" in kwargs or "batch_sise" in kwargs:
        with pytest.raises(OptionTypeError, match=r"^WindowDataset\(\)(: | )"):
            WindowDataset(missing, 10, **kwargs)


def test_source_weights_equal_the_weights_setting(two):
    a, b = two
    kw = {"split": "all", "batch_size": 64, "epoch_windows": 1000, "meta": True}
    by_list = WindowStream(two, 12, weights=(3, 1), **kw)
    by_source = WindowStream([CacheSource(a, weight=3), CacheSource(b, weight=1)], 12, **kw)
    assert by_source.mixture == by_list.mixture
    with by_list, by_source:
        assert np.array_equal(keys_of(list(by_list)), keys_of(list(by_source)))
    with pytest.raises(
        OptionError, match=r"^weights=\[3, None\]: .*2\.zarr has no weight: weight every CacheSource, or none$"
    ):
        WindowStream([CacheSource(a, weight=3), CacheSource(b)], 12, split="all", epoch_windows=1000)
    with pytest.raises(OptionTypeError, match="give each CacheSource its weight, or weights=, not both"):
        WindowStream([CacheSource(a, weight=3), b], 12, split="all", weights=(1, 1))


def test_source_storage_options_are_its_own(tmp_path, two):
    a, b = two
    with pytest.raises(OptionError, match="storage_options=.*this cache is already open"):
        CacheSource(a, storage_options={"anon": True})
    with pytest.raises(OptionTypeError, match="storage_options='x': must be a mapping of fsspec options"):
        CacheSource(a.url, storage_options="x")
    given = CacheSource(a.url, storage_options={"auto_mkdir": True})
    with pytest.raises(
        OptionTypeError, match=r"1\.zarr is a CacheSource with its own; give them there or here, not both"
    ):
        WindowStream([given, b.url], 12, split="all", storage_options=[{"auto_mkdir": False}, None])
    with WindowStream([given, CacheSource(b.url)], 12, split="all", batch_size=64, shuffle=False) as s:
        assert [c.url for c in s.caches] == [a.url, b.url] and s.n_batches > 0


def test_build_cache_takes_its_options_the_same_way(tmp_path):
    from shardcache import BuildOptions

    with pytest.raises(
        OptionTypeError,
        match=r"^build_cache\(\): pass options=BuildOptions\(\.\.\.\) or its fields \(split\), not both$",
    ):
        build_cache(tmp_path / "in.parquet", tmp_path / "c.zarr", BuildOptions(), split="train=1.0")
    with pytest.raises(OptionTypeError, match=r"^build_cache\(\) got an unexpected keyword argument 'splitt'$"):
        build_cache(tmp_path / "in.parquet", tmp_path / "c.zarr", splitt="train=1.0")


def test_the_constructors_name_few_parameters():
    """The stream's settings are grouped: at most 12 named parameters besides ``self`` and the fields."""
    for cls in (WindowStream, WindowDataset):
        params = inspect.signature(cls.__init__).parameters.values()
        named = [p for p in params if p.kind is not p.VAR_KEYWORD and p.name != "self"]
        assert len(named) <= 12, (cls.__name__, [p.name for p in named])
