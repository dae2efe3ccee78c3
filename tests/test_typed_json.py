"""The one dataclass <-> JSON codec (``shardcache.format.typed_json``): every manifest round-trips
through JSON text unchanged (Hypothesis), and data of another shape is refused naming the field's
path, whichever record holds it."""

from __future__ import annotations

import collections
import json
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardcache import BuildOptions, Manifest
from shardcache.format.manifest import BuildRecord, Bytes, Counts, Layout, Splits, Stats, Windows
from shardcache.format.typed_json import FieldError, dump, json_field, load

names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=8)
counts = st.integers(0, 2**53)
floats = st.floats(allow_nan=False, allow_infinity=False, width=32)


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    symbols = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    features = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    splits = draw(
        st.sampled_from(
            [
                Splits(),
                Splits(
                    spec="train=0.8,val=0.2",
                    names=["train", "val"],
                    stats_split="train",
                    cuts_ns=[draw(counts)],
                    bars={"train": 8, "val": 2},
                ),
            ]
        )
    )
    options = BuildOptions(
        split=splits.spec,
        normalize="zscore" if splits.stats_split else draw(st.sampled_from(["zscore", "none"])),
        shard_rows=draw(st.sampled_from([None, 1024])),
        stats_from=draw(st.sampled_from([None, "s3://bucket/other.zarr"])),
        columns=draw(st.sampled_from([None, ("open", "close")])),
    )
    stats = draw(
        st.none()
        | st.builds(
            Stats,
            mean=st.lists(floats, min_size=len(features), max_size=len(features)),
            std=st.lists(floats, min_size=len(features), max_size=len(features)),
            count=counts,
        )
    )
    return Manifest(
        feature_names=features,
        symbols=symbols,
        groups=[f"symbols/{i}" for i in range(len(symbols))],
        bars_per_symbol=draw(st.lists(counts, min_size=len(symbols), max_size=len(symbols))),
        layout=Layout(shard_rows=draw(st.integers(1, 2**24)), chunk_rows=draw(st.integers(1, 2**16))),
        splits=splits,
        stats=stats,
        counts=Counts(
            bars=draw(counts),
            dropped=draw(st.dictionaries(names, counts, max_size=2)),
            resampled=draw(st.sampled_from([None, {"from": ["1s"], "to": "1m"}])),
            unmapped=draw(st.none() | st.dictionaries(names, counts, min_size=1, max_size=2)),
            windows=Windows(count=draw(counts)),
        ),
        bytes=Bytes(stored=draw(counts), raw=draw(counts)),
        rolls={symbols[0]: [[draw(counts), 1, 2]]} if draw(st.booleans()) else {},
        tails={s: {"ts": draw(counts), "close": draw(floats)} for s in symbols},
        build=BuildRecord(
            options=options,
            max_gap_ns=draw(counts),
            bar_ns=draw(st.none() | counts),
            fingerprint="f" * 32,
            workers=draw(st.none() | st.integers(1, 64)),
        ),
        created="2026-12-07T06:00:00",
        shardcache_version="0.6.0",
        elapsed_s=draw(floats),
        appends=draw(st.integers(0, 3)),
    )


@settings(max_examples=150, deadline=None)
@given(manifests())
def test_every_manifest_round_trips_through_json_text(manifest):
    text = json.dumps(manifest.to_json(), allow_nan=False)
    back = Manifest.from_json(json.loads(text))
    assert back == manifest and back.identity == manifest.identity
    assert json.dumps(back.to_json()) == text  # key for key, in order
    assert ("appends" in back.to_json()) == bool(manifest.appends)  # written only once there was one
    assert back.to_json()["splits"]["stats_from"] == manifest.splits.stats_split  # stored under its key
    assert back.to_json()["bytes"]["ratio"] == manifest.bytes.ratio  # derived, for plain readers


def _built() -> dict:
    return Manifest(
        feature_names=["close"],
        symbols=["ES"],
        groups=["symbols/0"],
        bars_per_symbol=[5],
        layout=Layout(shard_rows=1024, chunk_rows=128),
    ).to_json()


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m["layout"].update(shard_rows="1024"), "the manifest's layout.shard_rows is a text, not int"),
        (lambda m: m["counts"]["windows"].pop("count"), "the manifest has no counts.windows.count"),
        (lambda m: m["symbols"].append(7), "the manifest's symbols[1] is a whole number, not str"),
        (lambda m: m.update(bars_per_symbol=[True]), "the manifest's bars_per_symbol[0] is a boolean, not int"),
        (lambda m: m["tails"].update(ES=[1]), "the manifest's tails.ES is a list, not dict"),
        (lambda m: m["splits"].update(extra=1), "the manifest's splits.extra is not a field of this format"),
        (lambda m: m["build"].update(codec="gzip"), "the manifest's build cannot be used (codec='gzip': choose one of"),
        (lambda m: m.update(stats={"mean": [0.0], "std": [1.0]}), "the manifest has no stats.count"),
    ],
)
def test_a_field_of_another_shape_is_named_by_its_path(edit, message):
    doc = _built()
    edit(doc)
    with pytest.raises(Exception, match="^the cache: " + message.replace("(", r"\(").replace("[", r"\[")):
        Manifest.from_json(doc)


@dataclass(frozen=True)
class Inner:
    n: int
    label: str | None = json_field(key="name", when_set=True, default=None)


@dataclass(frozen=True)
class Outer:
    inner: Inner = json_field(flatten=True)
    values: tuple[float, ...] = ()
    counted: collections.Counter[str] = json_field(default_factory=collections.Counter)
    table: np.ndarray | None = None


def test_records_rename_omit_flatten_and_keep_arrays_apart():
    value = Outer(inner=Inner(n=3), values=(1.0, 2.5), counted=collections.Counter(a=2), table=np.arange(3))
    arrays: list[np.ndarray] = []
    tree = dump(value, arrays)
    assert tree == {"n": 3, "values": [1.0, 2.5], "counted": {"a": 2}, "table": {"$npy": 0}} and len(arrays) == 1
    back = load(tree, Outer, {"0": arrays[0]})
    assert back.inner == value.inner and back.values == value.values and back.counted == value.counted
    assert isinstance(back.counted, collections.Counter) and np.array_equal(back.table, value.table)
    assert dump(Inner(n=1, label="x")) == {"n": 1, "name": "x"} and load({"n": 1, "name": "x"}, Inner).label == "x"
    with pytest.raises(FieldError, match=r"^table names a missing array"):
        load(tree, Outer, {})
    with pytest.raises(TypeError, match="cannot hold this array"):
        dump(value)  # arrays only where the caller keeps them apart
    with pytest.raises(FieldError, match=r"^values\[1\] is a text, not float"):
        load({**tree, "values": [1, "2"]}, Outer, {"0": arrays[0]})
