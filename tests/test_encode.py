"""The writer's bytes against zarr's own, bit for bit: ``encode`` (feature and time shards, for every codec,
partial last shards and empty inner chunks included) and ``metadata`` (every ``zarr.json`` a symbol has)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from zarr.storage import MemoryStore

from shardcache.format.decode import ShardDecoder, decode_shard
from shardcache.format.encode import encode_chunk, encode_shard
from shardcache.format.layout import CHUNK_KEYS, CODECS, TIME_ATTRS, chunk_codec, compressors
from shardcache.format.metadata import group_document, indented_json, symbol_documents, zarr_objects


def _zarr_objects(data: np.ndarray, ts: np.ndarray, shard_rows: int, chunk_rows: int, codec: str) -> dict[str, bytes]:
    """What zarr stores for ``data`` and ``ts`` written shard by shard (as the builder wrote them before
    the encoder existed): key -> bytes."""
    objects: dict = {}
    root = zarr.open_group(MemoryStore(objects), mode="w", zarr_format=3)
    g = root.create_group("symbols").create_group("0")
    f = max(data.shape[1], 1)
    feats = g.create_array(
        "features",
        shape=data.shape,
        dtype="float32",
        chunks=(chunk_rows, f),
        shards=(shard_rows, f),
        compressors=compressors(codec),
        fill_value=np.nan,
        dimension_names=("time", "feature"),
        chunk_key_encoding=CHUNK_KEYS,
    )
    times = g.create_array(
        "time",
        shape=ts.shape,
        dtype="int64",
        chunks=(chunk_rows,),
        shards=(shard_rows,),
        compressors=compressors("zstd"),
        fill_value=0,
        dimension_names=("time",),
        attributes=dict(TIME_ATTRS),
        chunk_key_encoding=CHUNK_KEYS,
    )
    for s in range(0, len(data), shard_rows):
        feats[s : s + shard_rows] = data[s : s + shard_rows]
        times[s : s + shard_rows] = ts[s : s + shard_rows]
    return {k: v.to_bytes() for k, v in objects.items()}


@st.composite
def blocks(draw):
    """A symbol's rows: random float32 values, some rounded (compressible), NaN runs that leave whole
    inner chunks empty, any length (partial last shards), and its strictly increasing bar times."""
    chunk_rows = draw(st.sampled_from([4, 16, 64]))
    shard_rows = chunk_rows * draw(st.sampled_from([1, 3, 8]))
    n = draw(st.integers(1, 3 * shard_rows + 5))
    f = draw(st.integers(1, 5))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    data = rng.standard_normal((n, f), dtype=np.float32)
    step = draw(st.integers(2, 9))
    data[::step] = np.round(data[::step])
    for _ in range(draw(st.integers(0, 3))):  # NaN runs: a whole inner chunk of NaN is left out, as zarr does
        a = draw(st.integers(0, n - 1))
        data[a : a + draw(st.integers(1, 2 * chunk_rows))] = np.nan
    ts = 10**18 + np.cumsum(rng.integers(1, 10**9, n))
    return data, ts, shard_rows, chunk_rows


@pytest.mark.parametrize("codec", CODECS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=blocks())
def test_shards_and_time_chunks_equal_zarrs_bit_for_bit(codec, case):
    data, ts, shard_rows, chunk_rows = case
    want = _zarr_objects(data, ts, shard_rows, chunk_rows, codec)
    feats, times = chunk_codec(codec), chunk_codec("zstd")
    for k, s in enumerate(range(0, len(data), shard_rows)):
        got = encode_shard(data[s : s + shard_rows], shard_rows, chunk_rows, feats)
        assert got == want.get(f"symbols/0/features/c.{k}.0"), k  # None where zarr stored nothing
        stamps = encode_shard(ts[s : s + shard_rows], shard_rows, chunk_rows, times, fill=0)
        assert stamps == want[f"symbols/0/time/c.{k}"]
        back = decode_shard(stamps, shard_rows, chunk_rows, times, np.int64, 0)
        np.testing.assert_array_equal(back[: len(ts[s : s + shard_rows])], ts[s : s + shard_rows])
    docs = symbol_documents(data.shape[1], shard_rows, chunk_rows, codec)
    for key, document in docs.symbol(0, len(data)).items():
        assert document == want[key], key


def test_the_decoder_reads_back_what_the_encoder_wrote(tmp_path):
    """Round trip through files, including a shard whose middle inner chunk is all NaN (left out)."""
    rng = np.random.default_rng(1)
    data = rng.standard_normal((700, 3), dtype=np.float32)
    data[64:128] = np.nan
    docs = symbol_documents(3, 256, 64, "blosc-lz4")
    codec = chunk_codec("blosc-lz4")
    for k, s in enumerate(range(0, 700, 256)):
        path = tmp_path / "features" / f"c.{k}.0"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(encode_shard(data[s : s + 256], 256, 64, codec))
    dec = ShardDecoder.from_metadata(zarr.storage.LocalStore(tmp_path), "features", docs.features_metadata(700))
    np.testing.assert_array_equal(dec.read(256, 700), data[256:])
    np.testing.assert_array_equal(dec.read(0, 64), data[:64])
    other = tmp_path / "other" / "c.0.0"  # another symbol of the same layout: ``like``, no metadata read
    other.parent.mkdir(parents=True)
    other.write_bytes(encode_shard(data[300:400], 256, 64, codec))
    twin = dec.like("other", 100)
    assert (twin.n_rows, twin.key(0)) == (100, "other/c.0.0") and dec.n_rows == 700
    np.testing.assert_array_equal(twin.read(0, 100), data[300:400])


def test_an_all_fill_chunk_or_shard_is_not_stored():
    codec = chunk_codec("zstd")
    assert encode_chunk(np.zeros(5, np.int64), 8, 0, codec) is None
    assert encode_chunk(np.full((3, 2), np.nan, np.float32), 8, np.nan, codec) is None
    assert encode_chunk(np.array([-0.0], np.float32), 8, 0.0, codec) is not None  # zarr compares bits: -0.0 is data
    assert encode_shard(np.full((10, 2), np.nan, np.float32), 16, 4, codec) is None


def test_documents_stamp_any_length():
    docs = symbol_documents(16, 65536, 8192, "blosc-lz4")
    for n in (0, 1, 300, 10**12):
        features = docs.features(n)
        assert b'"shape": [\n    %d,\n    16\n  ]' % n in features
        assert docs.features_metadata(n).shape == (n, 16)
    group = json.loads(docs.group)  # its bytes are zarr's: test_shards_and_time_chunks_equal_zarrs_bit_for_bit
    assert (group["node_type"], group["attributes"]) == ("group", {})


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6),  # unicode, quotes and control characters: escaped as json escapes them
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None)
@given(value=_JSON, indent=st.sampled_from([2, 0, 4]))
def test_group_documents_equal_zarrs_bit_for_bit(value, indent):
    """A group document with one attribute (the manifest's), made by ``metadata.group_document`` without
    zarr's copies and Python-level JSON encoding, is the document zarr writes, at any ``json_indent``."""
    with zarr.config.set({"json_indent": indent}):
        theirs = zarr_objects(lambda g: g.attrs.put({"shardcache": value}))["zarr.json"]
        assert group_document("shardcache", value) == theirs
    assert indented_json(value, indent) == json.dumps(value, indent=indent, allow_nan=True)
