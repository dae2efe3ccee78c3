"""``ShardDecoder`` against zarr's own read, bit for bit, for every codec ``build-cache`` writes."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardcache.format.decode import ChunkError, MissingShard, ShardDecoder
from shardcache.format.layout import CHUNK_KEYS, CODECS, compressors


def _array(path, data: np.ndarray, shard_rows: int, chunk_rows: int, codec: str) -> zarr.Array:
    arr = zarr.create_array(
        str(path),
        shape=data.shape,
        dtype="float32",
        chunks=(chunk_rows, data.shape[1]),
        shards=(shard_rows, data.shape[1]),
        compressors=compressors(codec),
        fill_value=np.nan,
        chunk_key_encoding=CHUNK_KEYS,  # build-cache's
        zarr_format=3,
    )
    for s in range(0, len(data), shard_rows):  # whole shards, as the builder writes them
        arr[s : s + shard_rows] = data[s : s + shard_rows]
    return arr


@pytest.fixture(scope="module", params=CODECS)
def stored(request, tmp_path_factory):
    rng = np.random.default_rng(0)
    data = rng.standard_normal((3000, 5), dtype=np.float32)
    data[::7] = np.round(data[::7])  # some compressible rows
    data[5, 2] = np.nan
    return data, _array(tmp_path_factory.mktemp(request.param) / "a.zarr", data, 512, 64, request.param)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 3000), st.integers(0, 3000))
def test_reads_equal_zarr_bit_for_bit(stored, a, b):
    data, arr = stored
    lo, hi = min(a, b), max(a, b)
    got = ShardDecoder(arr).read(lo, hi)
    want = arr[lo:hi]
    assert got.dtype == np.float32 and got.shape == want.shape
    assert got.tobytes() == want.tobytes() == data[lo:hi].tobytes()


def test_reads_into_a_given_array_and_edges(stored):
    data, arr = stored
    dec = ShardDecoder(arr)
    out = np.full((600, 5), 7, dtype=np.float32)
    assert dec.read(500, 1100, out) is out and out.tobytes() == arr[500:1100].tobytes()
    assert dec.read(2990, 3000).tobytes() == data[2990:].tobytes()  # the last, partial shard
    assert dec.read(512, 530).tobytes() == data[512:530].tobytes()  # few chunks: index + one range
    with pytest.raises(IndexError):
        dec.read(0, 3001)


@pytest.mark.parametrize("rows", [(512, 1024), (520, 530)])  # the whole shard; its index and one range
def test_damage_is_reported_with_the_shard(tmp_path, rows):
    data = np.arange(2048 * 3, dtype=np.float32).reshape(2048, 3)
    arr = _array(tmp_path / "a.zarr", data, 512, 64, "blosc-lz4")
    dec = ShardDecoder(arr)
    shard = tmp_path / "a.zarr" / "c.1.0"
    raw = bytearray(shard.read_bytes())
    raw[40] ^= 0xFF  # inside the first inner chunk of shard 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(ChunkError, match="crc32c") as err:
        dec.read(*rows)
    assert err.value.shard == 1
    assert dec.read(0, 512).tobytes() == data[:512].tobytes()  # other shards still read
    (tmp_path / "a.zarr" / "c.2.0").unlink()
    with pytest.raises(MissingShard) as missing:
        dec.read(1100, 1200)
    assert missing.value.shard == 2


def test_refuses_a_layout_it_does_not_read(tmp_path):
    plain = zarr.create_array(str(tmp_path / "p.zarr"), shape=(10, 2), dtype="float32", chunks=(5, 2), zarr_format=3)
    with pytest.raises(ValueError, match="layout"):
        ShardDecoder(plain)


@pytest.mark.parametrize("codec", CODECS)
def test_a_decoder_made_from_the_layout_reads_what_zarr_reads(tmp_path, codec):
    """What the manifest records (rows, features, shard and chunk rows, codec) is all a decoder needs."""
    data = np.random.default_rng(1).standard_normal((1300, 4), dtype=np.float32)
    arr = _array(tmp_path / "a.zarr", data, 512, 64, codec)
    dec = ShardDecoder.from_layout(
        arr.store_path.store, arr.store_path.path, n_rows=1300, n_features=4, shard_rows=512, chunk_rows=64, codec=codec
    )
    for lo, hi in [(0, 1300), (500, 530), (1024, 1300), (1299, 1300), (0, 0)]:
        assert dec.read(lo, hi).tobytes() == arr[lo:hi].tobytes()
    assert dec.key(2) == ShardDecoder(arr).key(2)
    with pytest.raises(ValueError, match="layout"):
        ShardDecoder.from_layout(
            arr.store_path.store, "", n_rows=1, n_features=4, shard_rows=512, chunk_rows=64, codec="gzip"
        )


def test_a_shard_holding_few_chunks_is_one_ranged_request(monkeypatch):
    """A small symbol's shard (300 rows: 5 of its 8 chunk slots) is read whole for 200 of its rows, as
    one request with a byte range (a GET without one costs s3fs a HEAD first); a big shard's few
    chunks are still its index and one range."""
    from zarr.abc.store import OffsetByteRequest
    from zarr.storage import FsspecStore

    data = np.arange(1324 * 3, dtype=np.float32).reshape(1324, 3)
    arr = _array(f"memory://{uuid.uuid4().hex}/a.zarr", data, 512, 64, "blosc-lz4")
    dec = ShardDecoder.from_layout(
        arr.store_path.store,
        arr.store_path.path,
        n_rows=1324,
        n_features=3,
        shard_rows=512,
        chunk_rows=64,
        codec="blosc-lz4",
    )
    asked = []
    real = FsspecStore.get

    async def get(self, key, prototype, byte_range=None):
        asked.append((key.rsplit("/", 1)[-1], byte_range))
        return await real(self, key, prototype, byte_range)

    monkeypatch.setattr(FsspecStore, "get", get)
    assert dec.read(1024, 1224).tobytes() == data[1024:1224].tobytes()  # the last shard: 300 rows
    assert asked == [("c.2.0", OffsetByteRequest(0))]
    asked.clear()
    assert dec.read(0, 64).tobytes() == data[:64].tobytes()  # one chunk of a full shard
    assert len(asked) == 2 and asked[0][1] is not None and asked[1][1] is not None
