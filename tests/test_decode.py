"""``ShardDecoder`` against zarr's own read, bit for bit, for every codec ``build-cache`` writes."""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shardcache.format.decode import ChunkError, MissingShard, ShardDecoder
from shardcache.format.layout import CODECS, compressors


def _array(path, data: np.ndarray, shard_rows: int, chunk_rows: int, codec: str) -> zarr.Array:
    arr = zarr.create_array(
        str(path),
        shape=data.shape,
        dtype="float32",
        chunks=(chunk_rows, data.shape[1]),
        shards=(shard_rows, data.shape[1]),
        compressors=compressors(codec),
        fill_value=np.nan,
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
    shard = tmp_path / "a.zarr" / "c" / "1" / "0"
    raw = bytearray(shard.read_bytes())
    raw[40] ^= 0xFF  # inside the first inner chunk of shard 1
    shard.write_bytes(bytes(raw))
    with pytest.raises(ChunkError, match="crc32c") as err:
        dec.read(*rows)
    assert err.value.shard == 1
    assert dec.read(0, 512).tobytes() == data[:512].tobytes()  # other shards still read
    (tmp_path / "a.zarr" / "c" / "2" / "0").unlink()
    with pytest.raises(MissingShard) as missing:
        dec.read(1100, 1200)
    assert missing.value.shard == 2


def test_refuses_a_layout_it_does_not_read(tmp_path):
    plain = zarr.create_array(str(tmp_path / "p.zarr"), shape=(10, 2), dtype="float32", chunks=(5, 2), zarr_format=3)
    with pytest.raises(ValueError, match="layout"):
        ShardDecoder(plain)
