"""Memory regression tests: streaming memory is flat in the cache size and across trials.

They extend ``tests/test_stream_workers.py`` (in-process RSS at 200K vs 2M rows; ten stream
and loader lifecycles inside the pytest process) with what those do not cover:

* the whole process tree with two DataLoader workers, sampled in the background by
  ``tools/bench_harness.py``'s sampler (RSS summed over the tree, and PSS), at 100K and 1M rows;
* ten hyperparameter "trials" in one fresh process, each opening the cache anew with other
  ``seq_len``/``batch_size``/``mix``, streaming and closing: nothing of a trial outlives it
  and RSS stays flat (the team's leak across hyperopt trials);
* ``WindowDataset`` random access, bounded by its LRU of decoded blocks whatever the rows.

Every measurement runs in its own interpreter (``python tests/test_memory.py COMMAND ...``),
and they assert memory only, never time.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
from helpers import make_cache, synthetic_bars

MIB = 2**20
TOOLS = Path(__file__).resolve().parents[1] / "tools"
SHARD_ROWS, CHUNK_ROWS, F = 4096, 512, 32
TREE_SHARE = 0.10  # peak RSS/PSS of the 3-process tree at 1M rows within 10% of 100K rows (the bound)
TRIALS_BOUND = 32 * MIB  # RSS growth from the end of trial 2 to the end of trial 10
LRU_ALLOWANCE = 48 * MIB  # zarr's decode buffers and allocator arenas on top of the LRU's blocks
RANDOM_BOUND = 16 * MIB  # WindowDataset peak growth: 1M rows minus 100K rows


def _profile_memory():
    spec = importlib.util.spec_from_file_location("bench_harness", TOOLS / "bench_harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


def _child(*args: object) -> dict:
    """Run ``python tests/test_memory.py ARGS`` and parse the JSON it prints."""
    proc = subprocess.run(
        [sys.executable, __file__, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def caches(tmp_path_factory) -> dict[int, str]:
    """The same kind of bars at 100K and 1M rows, F=32, 4096-row shards (25 shards at 100K, so both
    caches give the streams room to prefetch as far as their budget allows)."""
    root = tmp_path_factory.mktemp("memory")
    out = {}
    for n in (100_000, 1_000_000):
        bars = synthetic_bars(n, F, n_symbols=4, gaps=3, short=0, seed=3, compressible=True)
        out[n] = make_cache(root / f"{n}.zarr", bars, shard_rows=SHARD_ROWS, chunk_rows=CHUNK_ROWS).url
    return out


def test_worker_tree_memory_does_not_grow_with_bars(caches):
    """Two DataLoader workers, 150 batches of 512 windows: the tree's peaks at 10x the rows are at most 10% above 1x."""
    profile = _profile_memory().profile
    peaks = {}
    for n, path in caches.items():
        # each size's peak over two runs: PSS is sampled every 20 ms, and one run's samples can miss its peak
        # by a fifth (the workers' copy-on-write pages change by the millisecond: 236-290 MiB in runs alike)
        runs = [profile([sys.executable, __file__, "tree", path, "2", "150"], 0.02, f"{n} rows") for _ in range(2)]
        for prof in runs:
            assert prof.exit_code == 0 and max(prof.nprocs) >= 3, (prof.exit_code, max(prof.nprocs))
        pss = [p.peak_pss_tree for p in runs]
        peaks[n] = (max(p.peak_rss_tree for p in runs), None if None in pss else max(pss))
    (rss_s, pss_s), (rss_b, pss_b) = peaks[100_000], peaks[1_000_000]
    print({n: [v // MIB for v in p if v is not None] for n, p in peaks.items()})
    # growth is what is bounded: a sampled peak can come out lower at 10x (PSS is read every 20 ms)
    assert rss_b - rss_s < TREE_SHARE * rss_s, peaks
    if pss_s is not None and pss_b is not None:
        assert pss_b - pss_s < TREE_SHARE * pss_s, peaks


def test_ten_trials_in_one_process_leave_nothing_behind(caches):
    """Trials with other window shapes each open, stream and close; the last eight add < 32 MiB."""
    out = _child("trials", caches[1_000_000])
    assert out["alive"] == 0, out  # no stream or cache of a closed trial is still reachable
    rss = out["rss"]
    print([r // MIB for r in rss])
    assert max(rss[2:]) - rss[1] < TRIALS_BOUND, [r // MIB for r in rss]


def test_window_dataset_random_access_is_bounded_by_its_lru(caches):
    """Random ``ds[i]`` over the whole cache keeps at most the LRU's blocks, at 1x and 10x the rows."""
    got = {n: _child("random", path, 600) for n, path in caches.items()}
    for n, g in got.items():
        assert g["peak"] <= g["lru_bytes"] + LRU_ALLOWANCE, (n, g)
    assert abs(got[1_000_000]["peak"] - got[100_000]["peak"]) < RANDOM_BOUND, got


# ---- the measured processes (run as ``python tests/test_memory.py COMMAND ARGS``) -----------------


def _tree(path: str, workers: int, batches: int) -> None:
    """Stream ``batches`` batches through ``workers`` DataLoader workers; the parent samples the tree."""
    from shardcache import WindowStream

    with WindowStream(path, 16, split="all", batch_size=512, mix=4, prefetch=2) as ds:
        for i, _ in enumerate(ds.loader(workers)):
            if i + 1 == batches:
                break


def _trials(path: str) -> dict:
    """Ten hyperopt-like trials: RSS after each (collected), and how many trial objects survive."""
    import psutil

    from shardcache import WindowStream, open_cache

    proc, rss, refs = psutil.Process(), [], []
    shapes = [(16, 256, 4), (60, 128, 2), (32, 512, 8), (8, 1024, 4), (45, 64, 1)] * 2
    for seq_len, batch, mix in shapes:
        cache = open_cache(path)
        ds = WindowStream(cache, seq_len, split="all", batch_size=batch, mix=mix, shuffle=True)
        for i, (x, _y) in enumerate(ds):
            if i == 40:
                break
        ds.close()
        refs += [weakref.ref(ds), weakref.ref(cache)]
        del ds, cache, x, _y
        gc.collect()
        rss.append(proc.memory_info().rss)
    return {"rss": rss, "alive": sum(r() is not None for r in refs)}


def _random(path: str, n: int) -> dict:
    """``n`` random ``ds[i]`` over every window: peak RSS growth and the LRU's bytes at most."""
    import numpy as np
    import psutil

    from shardcache import WindowDataset
    from shardcache.tuning import LRU_BLOCKS

    proc = psutil.Process()
    ds = WindowDataset(path, 60, split="all")
    base = peak = proc.memory_info().rss
    for i in np.random.default_rng(0).integers(0, len(ds), n).tolist():
        ds[i]
        peak = max(peak, proc.memory_info().rss)
    block = (ds.cache.shard_rows + ds.span - 1) * ds.cache.n_features * 4
    return {"peak": peak - base, "lru_bytes": LRU_BLOCKS * block}


if __name__ == "__main__":
    command, rest = sys.argv[1], sys.argv[2:]
    if command == "tree":
        _tree(rest[0], int(rest[1]), int(rest[2]))
    elif command == "trials":
        print(json.dumps(_trials(rest[0])))
    elif command == "random":
        print(json.dumps(_random(rest[0], int(rest[1]))))
    else:
        raise SystemExit(f"unknown command {command}")
