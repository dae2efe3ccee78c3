"""``bench.py loaders`` (``make bench``): the team's naive loader, memmap and in-RAM baselines and ``WindowStream``.

On the same bars at each ``--features`` F (F=9: the ~665K-bar DBN sample; other F: 665K-bar Parquet of F columns):
**A** naive: a list of ``(torch.tensor(bars[p:p+60]), target)`` pairs, ``DataLoader(list, shuffle=True)``, built on
``--naive-windows`` windows, memory and first batch extrapolated (``~``); **B** a map-style ``Dataset`` of
``torch.from_numpy(mm[p:p+60])`` over a memmap, ``DataLoader(shuffle=True)``; **C** the memmap gathered with one numpy
fancy index per batch; **D** the in-RAM ceiling: ``torch.index_select`` into preallocated outputs; **E**
``WindowStream`` over the compressed cache in-process (w=0), ``--worker-batches`` batches through
``DataLoader(ds, batch_size=None, num_workers=2)`` (w=2) and ``ds.loader(2)`` (EL); ER resident (two epochs of
``memory_budget="auto"``, windows/s the second's); EM the bars as two caches, epochs alternated with the one
cache's in one process (``--mix-epochs`` pairs a round), judged by the median ratio. Batches of 256, shuffled.

Each scenario is a profiled process (tree RSS and PSS), one torch and OpenMP thread, ``--rounds`` interleaved
rounds: windows/s the best round's, first batch the worst's, memory the highest peak. Also: the builds, streaming
memory at 1x and ``--scale``x the bars (F=256), zarr's read path against ``Cache.read_rows`` (a process per
``zarr.config`` setting), a batch's hand-over, the RSS plot of A and E (``--plot``). Exit 1 when a target fails.
"""

from __future__ import annotations

import importlib.util
import itertools
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from bench_builds import BuildResult, build_table, dir_bytes, ensure_mix_caches, ensure_scaled_cache, prepare_data
from bench_harness import BATCH, GIB, HORIZON, MIB, SEQ_LEN, Row, machine, parser, plot, run, table, timed, write_json
from torch.utils.data import DataLoader, Dataset

from shardcache import WindowStream

__all__ = ["CHILDREN", "COMMANDS", "MemmapWindows", "main", "read_probe", "read_table"]

TARGETS = (("E >= 1.0x C", "C", 1.0), ("E >= 3x B", "B", 3.0), ("E >= 0.7x D", "D", 0.7))
RSS_BOUND, SCALE_TOLERANCE, FIRST_BATCH_BOUND = 0.5 * GIB, 0.10, 0.5
WORKERS_BOUND = 0.7  # DataLoader workers against the same stream in-process (issue #14)
MIX_BOUND = 0.9  # a stream of two caches against one cache of the same bars, in-process (issue #23)
ZARR_SETTINGS = {
    "default": {},
    "async.concurrency=1": {"ZARR_ASYNC__CONCURRENCY": "1"},
    "async.concurrency=64": {"ZARR_ASYNC__CONCURRENCY": "64"},
    "threading.max_workers=1": {"ZARR_THREADING__MAX_WORKERS": "1"},
    "codec_pipeline.batch_size=8": {"ZARR_CODEC_PIPELINE__BATCH_SIZE": "8"},
}
if importlib.util.find_spec("zarrs"):  # zarr with the zarrs (Rust) codec pipeline where installed; not a dependency
    ZARR_SETTINGS["codec_pipeline.path=zarrs"] = {"ZARR_CODEC_PIPELINE__PATH": "zarrs.ZarrsCodecPipeline"}


# -- scenario processes --------------------------------------------------------------------
class MemmapWindows(Dataset):
    """B: map-style windows of a memmap, one ``torch.from_numpy`` view per window and target."""

    def __init__(self, rows: np.ndarray, starts: np.ndarray) -> None:
        self.rows, self.starts = rows, starts

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        p = int(self.starts[i])
        return torch.from_numpy(self.rows[p : p + SEQ_LEN]), torch.from_numpy(self.rows[p + SEQ_LEN])


def _permuted(spec: dict) -> np.ndarray:
    """This round's random order of the valid starts (a full epoch)."""
    starts = np.load(spec["starts"])
    return starts[np.random.default_rng([7, spec["round"]]).permutation(len(starts))]


def _naive(spec: dict) -> dict[str, Any]:
    """A: every window as its own tensor in a Python list, then a shuffling DataLoader."""
    proc, t0 = psutil.Process(), time.perf_counter()
    bars = np.fromfile(spec["raw"], np.float32).reshape(-1, spec["F"])  # the naive loader holds every bar
    starts = np.load(spec["starts"])[: spec["naive_windows"]]
    rss0, t1 = proc.memory_info().rss, time.perf_counter()
    windows = [(torch.tensor(bars[p : p + SEQ_LEN]), torch.tensor(bars[p + SEQ_LEN])) for p in starts]
    t2, rss1 = time.perf_counter(), proc.memory_info().rss
    out = timed(lambda: iter(DataLoader(windows, batch_size=BATCH, shuffle=True)))
    out.update(load_s=t1 - t0, list_s=t2 - t1, list_bytes=rss1 - rss0, rss_before_list=rss0, n_windows=len(starts))
    out["first_batch_s"] += t2 - t0
    return out


def _memmap(spec: dict) -> dict[str, Any]:
    """B: map-style Dataset over a memmap with DataLoader's shuffling and collation."""
    starts = np.load(spec["starts"])

    def open_data() -> Iterator[tuple]:
        rows = np.memmap(spec["raw"], np.float32, "c", shape=(spec["n_bars"], spec["F"]))
        return iter(DataLoader(MemmapWindows(rows, starts), batch_size=BATCH, shuffle=True))

    return timed(open_data)


def _batched(spec: dict) -> dict[str, Any]:
    """C: the memmap gathered with one numpy fancy index per batch."""
    perm, n, f = _permuted(spec), spec["n_bars"], spec["F"]

    def open_data() -> Iterator[tuple]:
        rows = np.asarray(np.memmap(spec["raw"], np.float32, "r", shape=(n, f)))
        view = np.lib.stride_tricks.as_strided(rows, (n - SEQ_LEN + 1, SEQ_LEN, f), (4 * f, 4 * f, 4), writeable=False)
        for b in range(0, len(perm), BATCH):
            idx = perm[b : b + BATCH]
            yield torch.from_numpy(view[idx]), torch.from_numpy(rows[idx + SEQ_LEN])

    return timed(open_data)


def _ram(spec: dict) -> dict[str, Any]:
    """D: the gather ceiling, whole array in RAM, preallocated outputs, one thread."""
    perm, n, f = torch.from_numpy(_permuted(spec)), spec["n_bars"], spec["F"]

    def open_data() -> Iterator[tuple]:
        t = torch.from_numpy(np.fromfile(spec["raw"], np.float32).reshape(n, f))
        win = torch.as_strided(t, (n - SEQ_LEN + 1, SEQ_LEN, f), (f, f, 1))
        buf, ybuf = torch.empty(BATCH, SEQ_LEN, f), torch.empty(BATCH, f)
        for b in range(0, len(perm), BATCH):
            idx = perm[b : b + BATCH]
            m = len(idx)
            torch.index_select(win, 0, idx, out=buf[:m])
            torch.index_select(t, 0, idx + SEQ_LEN, out=ybuf[:m])
            yield buf[:m], ybuf[:m]

    return timed(open_data)


def _stream(spec: dict) -> dict[str, Any]:
    """E: the stream in-process or through ``spec["workers"]`` workers, a full epoch or ``batches``; with
    ``budget`` (ER) two epochs of one resident stream, windows/s the second's (it only gathers)."""
    streams: list[WindowStream] = []

    def open_data() -> Iterator[tuple]:
        kw = {"seed": spec["round"], "memory_budget": spec.get("budget")}
        ds = WindowStream(spec["cache"], SEQ_LEN, horizon=HORIZON, split="all", batch_size=BATCH, shuffle=True, **kw)
        streams.append(ds)
        if not spec["workers"]:
            loader: Any = ds
        elif spec.get("loader"):
            loader = ds.loader(num_workers=spec["workers"])
        else:
            loader = DataLoader(ds, batch_size=None, num_workers=spec["workers"])
        yield from itertools.islice(loader, spec["batches"] or None)

    out = timed(open_data)
    with streams[0] as ds:
        if spec.get("budget") is not None:
            assert ds.resident, f"memory_budget {spec['budget']} does not hold the split's bars"
            second = timed(lambda: iter(ds))
            out |= {"epoch1_windows_per_s": out["windows_per_s"], "epoch2_first_batch_s": second["first_batch_s"]}
            out["windows_per_s"] = out["epoch2_windows_per_s"] = second["windows_per_s"]
    return out


def _mix(spec: dict) -> dict[str, Any]:
    """EM: epochs over the two caches and over the one cache of the same bars, alternated pair by pair."""

    def epoch(src: Any, seed: int) -> dict[str, Any]:
        with WindowStream(src, SEQ_LEN, horizon=HORIZON, split="all", batch_size=BATCH, shuffle=True, seed=seed) as ds:
            return timed(lambda: iter(ds))

    seeds = [spec["round"] * spec["epochs"] + k for k in range(spec["epochs"])]
    pairs = [(epoch(spec["cache"], s), epoch(spec["one"], s)) for s in seeds]
    two, one = ([p[i]["windows_per_s"] for p in pairs] for i in (0, 1))
    return {
        "windows_per_s": float(np.median(two)),
        "first_batch_s": max(p[0]["first_batch_s"] for p in pairs),
        "windows": pairs[0][0]["windows"],
        "one_windows_per_s": float(np.median(one)),
        "ratios": [a / b for a, b in zip(two, one)],
    }


def _median_ms(fn: Callable[[int], Any], shards: list[int]) -> float:
    """Median milliseconds of ``fn(shard)`` over two rounds of ``shards``, after one warm-up call."""
    fn(shards[0])
    times = []
    for s in shards * 2:
        t = time.perf_counter()
        fn(s)
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def read_probe(spec: dict) -> dict[str, Any]:
    """The read path per cache (a fresh process under its ``ZARR_*`` settings): ms per whole shard through
    zarr's ``features[a:b]`` and, with ``full``, through ``Cache.read_rows`` (shardcache's ``ShardDecoder``),
    the stream's block (shard + overhang), other inner chunk sizes, a batch into new plain and shared memory."""
    out = {str(res["F"]): res for res in (_probe(path, spec) for path in spec["caches"])}
    return {"caches": out, "windows_per_s": 0.0}


def _probe(path: str, spec: dict) -> dict[str, Any]:
    """``read_probe``'s figures for the cache at ``path``."""
    import zarr

    from shardcache import open_cache
    from shardcache.format.decode import ShardDecoder
    from shardcache.format.layout import compressors

    cache = open_cache(path)
    rows, f, shards = cache.shard_rows, cache.n_features, cache.rows.shard_table
    # whole shards followed by another in the same region (so a block's overhang exists)
    firsts = [int(a) for (_, a, b), (_, c, _) in itertools.pairwise(shards) if b - a == rows and c == b]
    firsts = firsts[: spec["shards"]]

    def zarr_rows(a: int) -> np.ndarray:
        sym, local = (int(x[0]) for x in cache.rows.locate(np.array([a])))
        return np.asarray(cache.array(sym, "features")[local : local + rows])

    res: dict[str, Any] = {"F": f, "shard_rows": rows, "chunk_rows": cache.chunk_rows, "shard_mib": rows * f * 4 / MIB}
    res["zarr_ms"] = _median_ms(zarr_rows, firsts)
    if not spec["full"]:
        return res
    batch = torch.randn(BATCH, SEQ_LEN, f)

    def into_shared(_: int) -> torch.Tensor:
        storage = torch.UntypedStorage._new_shared(4 * batch.numel())
        return torch.empty(0).set_(storage, 0, batch.shape).copy_(batch)

    res["read_rows_ms"] = _median_ms(lambda a: cache.read_rows(a, a + rows), firsts)
    res["batch_plain_ms"] = _median_ms(lambda a: torch.empty(batch.shape).copy_(batch), firsts)
    res["batch_shared_ms"] = _median_ms(into_shared, firsts)
    res["block_ms"] = _median_ms(lambda a: cache.read_rows(a, a + rows + SEQ_LEN), firsts)
    data, res["chunk_ms"] = np.concatenate([cache.read_rows(a, a + rows) for a in firsts]), {}
    codec = compressors(cache.manifest.layout.codec)
    for chunk in sorted({max(1, rows // 32), rows // 8, rows}):
        tmp = Path(spec["tmp"]) / f"chunks-{f}-{chunk}.zarr"
        kw = {"chunks": (chunk, f), "shards": (rows, f), "compressors": codec, "fill_value": np.nan, "zarr_format": 3}
        arr = zarr.create_array(str(tmp), shape=data.shape, dtype="float32", **kw)
        for k in range(len(firsts)):  # whole shards, as build-cache writes them
            arr[k * rows : (k + 1) * rows] = data[k * rows : (k + 1) * rows]
        dec = ShardDecoder(arr)
        res["chunk_ms"][chunk] = _median_ms(lambda k, d=dec: d.read(k * rows, (k + 1) * rows), [*range(len(firsts))])
        shutil.rmtree(tmp)
    return res


CHILDREN = {"naive": _naive, "memmap": _memmap, "batched": _batched, "ram": _ram, "stream": _stream, "mix": _mix}
CHILDREN["read"] = read_probe


# -- the parent: data, runs, tables ----------------------------------------------------------
def read_table(probes: dict[str, dict], epochs: dict[int, tuple[float, int]]) -> str:
    """Zarr's read path: ms per shard under each setting (``probes``: name -> ``read_probe`` result),
    and decode's share of an in-process epoch (``epochs``: F -> (seconds, bars))."""
    base = probes["default"]["caches"]
    fs = sorted(base, key=int)
    head = ["read path and batch hand-off (ms, median)"]
    head += [f"F={f} ({base[f]['shard_rows']:,} rows, {base[f]['shard_mib']:.1f} MiB)" for f in fs]
    rows = []

    def add(name: str, values: list[float]) -> None:
        rows.append([name, *(f"{v:.2f}" for v in values)])

    chunks = "/".join(str(base[f]["chunk_rows"]) for f in fs)
    add(f"zarr `features[a:b]`, default config (inner chunks {chunks} rows)", [base[f]["zarr_ms"] for f in fs])
    for name, probe in probes.items():
        if name != "default":
            add(f"zarr `features[a:b]` with {name}", [probe["caches"][f]["zarr_ms"] for f in fs])
    what = "`Cache.read_rows` (shardcache's ShardDecoder: one request, crc32c, decode in place)"
    add(what, [base[f]["read_rows_ms"] for f in fs])
    add("stream block: shard + 60-row overhang (reads into the next shard)", [base[f]["block_ms"] for f in fs])
    for k in range(3):
        sizes = "/".join(f"{list(base[f]['chunk_ms'])[k]}" for f in fs)
        add(f"`Cache.read_rows`, inner chunk {sizes} rows", [list(base[f]["chunk_ms"].values())[k] for f in fs])
    add("one batch (256 x 60 x F) into new memory: plain (w=0)", [base[f]["batch_plain_ms"] for f in fs])
    add("one batch into new shared memory (what a DataLoader worker sends)", [base[f]["batch_shared_ms"] for f in fs])
    shares = []
    for f in fs:
        seconds, bars = epochs[int(f)]
        shares.append(100 * -(-bars // base[f]["shard_rows"]) * base[f]["block_ms"] / 1e3 / seconds)
    add("decoding one epoch's blocks, % of an in-process E epoch (done by the decoder threads)", shares)
    return table(head, rows)


def _scenarios(d: dict, args: Any) -> list[tuple[str, str, str, dict, int]]:
    """(key, kind, label, spec, bytes on disk) of every throughput scenario at one F."""
    base = {k: d[k] for k in ("F", "raw", "starts", "cache", "n_bars")}
    base.update(batches=0, naive_windows=args.naive_windows, workers=0)
    f, raw, cache = d["F"], d["raw_bytes"], d["cache_bytes"]
    w2 = {"batches": args.worker_batches, "workers": 2}
    mix = {**base, "cache": d["mix"], "one": d["cache"], "epochs": args.mix_epochs}
    return [
        ("A", "naive", f"A naive list F={f}", base, raw),
        ("B", "memmap", f"B memmap map-style F={f}", base, raw),
        ("C", "batched", f"C memmap batched F={f}", base, raw),
        ("D", "ram", f"D in-RAM gather F={f}", base, raw),
        ("E0", "stream", f"E WindowStream w=0 F={f}", base, cache),
        ("E2", "stream", f"E WindowStream w=2 F={f}", {**base, **w2}, cache),
        ("EL", "stream", f"E stream.loader(2) F={f}", {**base, **w2, "loader": True}, cache),
        ("ER", "stream", f"E WindowStream resident F={f}", {**base, "budget": "auto"}, cache),
        ("EM", "mix", f"E WindowStream of 2 caches F={f}", mix, d["mix_bytes"]),
    ]


def _main_table(rows: list[Row], data: dict[int, dict]) -> str:
    """The scenarios table: windows/s, ratio to C, memory, first batch, bytes on disk."""
    head = ["scenario", "F", "windows timed", "windows/s", "vs C", "peak RSS MiB", "peak PSS MiB", "first batch s"]
    out = []
    for r in rows:
        f, res = r.spec["F"], r.result
        c = next(x for x in rows if x.key == "C" and x.spec["F"] == f)
        (rss, pss), first, label = r.memory(), f"{r.first_s:.3f}", r.label[: -len(f" F={f}")]
        if r.key == "ER":
            e1 = max(x["epoch1_windows_per_s"] for x in r.results)
            label += f", epoch 2 (epoch 1: {e1:,.0f} windows/s, {e1 / c.rate:.2f}x C)"
        if r.key == "A":
            n_all = data[f]["n_windows"]
            full_rss = res["rss_before_list"] + res["list_bytes"] / res["n_windows"] * n_all
            rss += f" (~{full_rss / GIB:,.1f} GiB for {n_all:,})"
            first += f" (~{r.first_s + res['list_s'] * (n_all / res['n_windows'] - 1):,.0f} for all)"
        row = [label, f, f"{res['windows']:,}", f"{r.rate:,.0f}", f"{r.rate / c.rate:.2f}x", rss, pss, first]
        out.append([*row, f"{r.disk / MIB:,.1f}"])
    return table([*head, "on disk MiB"], out)


def _targets(rows: list[Row], scaling: list[Row]) -> list[tuple[str, str, str, bool]]:
    """(target, where, measured, passed) for every target and E variant."""
    out = []
    for r in (x for x in rows if x.key.startswith("E")):
        f, first = r.spec["F"], r.first_s
        where = f"F={f}, {r.label.split(' F=')[0]}"
        for name, other, bound in TARGETS:
            base = next(x for x in rows if x.key == other and x.spec["F"] == f)
            out.append((name, where, f"{r.rate / base.rate:.2f}x", r.rate / base.rate >= bound))
        if r.key == "EM":  # the median of the pairs' ratios, every round's
            ratio = float(np.median([q for res in r.results for q in res["ratios"]]))
            one = max(res["one_windows_per_s"] for res in r.results)
            text = f"{ratio:.2f}x (median of paired epochs; 1 cache {one:,.0f}/s)"
            out.append((f"2 caches >= {MIX_BOUND}x 1 cache", where, text, ratio >= MIX_BOUND))
        if r.spec["workers"]:
            ratio = r.rate / next(x for x in rows if x.key == "E0" and x.spec["F"] == f).rate
            name = f"workers >= {WORKERS_BOUND}x in-process"
            out.append((name, where, f"{ratio:.2f}x E w=0", ratio >= WORKERS_BOUND))
        out.append((f"first batch <= {FIRST_BATCH_BOUND} s", where, f"{first:.3f} s", first <= FIRST_BATCH_BOUND))
        if f == 256 and r.key != "ER":  # ER holds the split's bars by design (its memory_budget)
            peak = r.prof.peak_rss_tree
            out.append(("peak RSS <= 0.5 GiB (665K x 256)", where, f"{peak / GIB:.3f} GiB RSS", peak <= RSS_BOUND))
            if r.spec["workers"] and r.peak_pss is not None:
                pss = r.peak_pss
                out.append(("peak PSS <= 0.5 GiB (665K x 256)", where, f"{pss / GIB:.3f} GiB PSS", pss <= RSS_BOUND))
    for one, big in zip(scaling[::2], scaling[1::2]):
        growth = big.prof.peak_rss_tree / one.prof.peak_rss_tree - 1
        where = f"F=256, {one.label.split(' 1x')[0]}, 1x vs {big.spec['scale']}x"
        out.append(("peak RSS within 10% at 10x bars", where, f"{growth:+.1%}", abs(growth) <= SCALE_TOLERANCE))
    return out


def _scaling_table(scaling: list[Row]) -> str:
    """Streaming memory per cache size, and the RSS a fresh process has after its imports alone."""
    head = ["stream", "cache", "bars", "workers", "batches", "windows/s", "peak RSS MiB", "peak PSS MiB"]
    rows = []
    for r in scaling:
        row = ["E WindowStream", Path(r.spec["cache"]).name, f"{r.spec['bars']:,}", r.spec["workers"]]
        rows.append([*row, r.spec["batches"], f"{r.rate:,.0f}", *r.memory()])
    code = "import psutil, {}; print(psutil.Process().memory_info().rss)"
    mods = ("torch", "torch, zarr, fsspec", "torch, shardcache.read.stream")
    rss = (subprocess.run([sys.executable, "-c", code.format(m)], capture_output=True, check=True) for m in mods)
    imports = ", ".join(f"`{m}` {int(v.stdout) / MIB:.0f} MiB" for m, v in zip(mods, rss))
    return table(head, rows, left=2) + f"\n\nRSS after imports alone: {imports}."


def _plot(naive: Row, stream: Row, n_all: int, path: Path) -> None:
    """RSS over time of the naive list and of WindowStream (their highest-peak rounds), < 150 KB."""
    res = naive.result
    full = (res["rss_before_list"] + res["list_bytes"] / res["n_windows"] * n_all) / GIB
    naive.prof.label = f"A naive list, {res['n_windows']:,} windows"
    stream.prof.label = f"E WindowStream, one epoch of {stream.result['windows']:,} windows"
    fig = plot([naive.prof, stream.prof])
    fig.set_size_inches(8, 4.5)
    ax = fig.axes[0]
    ax.set_title(f"Process RSS over time, F={stream.spec['F']}, seq_len {SEQ_LEN} (tools/bench.py loaders)")
    text = f"naive, all {n_all:,} windows: ~{full:.1f} GiB (extrapolated)"
    ax.annotate(text, xy=(0.5, 0.9), xycoords="axes fraction", fontsize="small", color="C0")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


def main(argv: list[str]) -> int:
    """Run everything, print the report (markdown), write JSON and the plot; exit 1 if a target fails."""
    args = parser(
        *("loaders", __doc__, "work", "json"),
        plot=("docs/img/rss_naive_vs_shardcache.png", "RSS-over-time PNG, A vs E at the largest F ('' for none)"),
        features=("9,64,256", "feature counts to run"),
        naive_windows=(20_000, "windows A builds"),
        rounds=(3, "rounds over all scenarios, interleaved"),
        worker_batches=(2000, "batches per E run with 2 workers"),
        mix_epochs=(5, "epoch pairs (2 caches, 1 cache) per round of EM"),
        scale=(10, "bars multiple of the F=256 memory-scaling cache; 1 skips it"),
        scale_batches=(600, "batches streamed per scaling run"),
    ).parse_args(argv)
    t_start = time.perf_counter()
    args.work.mkdir(parents=True, exist_ok=True)
    builds: list[BuildResult] = []
    data = {f: prepare_data(args.work, f, builds) for f in sorted(int(x) for x in args.features.split(","))}
    for f, d in data.items():  # the same bars as two caches (EM)
        d["mix"] = ensure_mix_caches(args.work, f)
        d["mix_bytes"] = sum(dir_bytes(Path(p)) for p in d["mix"])
    found: dict[tuple[int, str], Row] = {}
    for rnd in range(args.rounds):
        for d in data.values():
            for key, kind, label, spec, disk in _scenarios(d, args):
                row = found.setdefault((d["F"], key), Row(key, label, spec, disk))
                row.add(*run("bench_loaders", kind, {**spec, "round": rnd}, f"{label} #{rnd + 1}"))
    rows, scaling = list(found.values()), []
    if args.scale > 1 and 256 in data:
        big = ensure_scaled_cache(args.work, 256, args.scale)
        for workers in (0, 2):  # one round: memory varies less than speed
            for path, scale in ((data[256]["cache"], 1), (str(big), args.scale)):
                spec = {"F": 256, "cache": path, "bars": 665_000 * scale, "scale": scale, "workers": workers}
                spec |= {"batches": args.scale_batches, "round": 0}
                scaling.append(Row("S", f"E w={workers} {scale}x", spec, dir_bytes(Path(path))))
                scaling[-1].add(*run("bench_loaders", "stream", spec, scaling[-1].label))
    probes, spec = {}, {"caches": [d["cache"] for d in data.values()], "shards": 10, "tmp": str(args.work)}
    for name, env in ZARR_SETTINGS.items():
        label = f"read path {name}"
        probes[name] = run("bench_loaders", "read", {**spec, "full": name == "default"}, label, env=env)[0]
    targets = _targets(rows, scaling)
    epochs = {r.spec["F"]: (r.result["windows"] / r.rate, r.spec["n_bars"]) for r in rows if r.key == "E0"}
    head = f"shardcache benchmark, {time.strftime('%Y-%m-%d')}: {machine()}, torch {torch.__version__}; "
    head += f"seq_len {SEQ_LEN}, batch {BATCH}, shuffle on; 1 torch thread per process; total run "
    head += f"{time.perf_counter() - t_start:.0f} s."
    note = f"A ran on {args.naive_windows:,} windows; `~` extrapolates its memory and first batch linearly to "
    note += f"every window. {args.rounds} interleaved rounds: windows/s is the best round's, first batch the worst, "
    note += "memory the highest peak. RSS: process tree (workers included); PSS counts shared pages once. B and C "
    note += "map the raw file: their RSS includes the page-cache pages they touched. Every process starts with "
    note += "torch and shardcache imported."
    report = [head, "", "### Builds", "", build_table(builds), "", "### Loaders (same bars, same run)", ""]
    report += [_main_table(rows, data), "", note]
    if scaling:
        report += ["", f"### Streaming memory at 1x and {args.scale}x the bars (F=256)", "", _scaling_table(scaling)]
    report += ["", "### Zarr read path", "", read_table(probes, epochs), "", "### Targets", ""]
    verdicts = [(*t[:3], "PASS" if t[3] else "FAIL") for t in targets]
    report.append(table(["target", "where", "measured", "result"], verdicts, left=2))
    print("\n".join(report))
    pick = {r.key: r for r in rows if r.spec["F"] == max(data) and r.key in ("A", "E0")}
    if len(pick) == 2 and args.plot:
        _plot(pick["A"], pick["E0"], data[max(data)]["n_windows"], Path(args.plot))
        print(f"\nwrote {args.plot} ({Path(args.plot).stat().st_size / 1024:.0f} KiB)", file=sys.stderr)
    payload = {"date": time.strftime("%Y-%m-%d"), "cpus": psutil.cpu_count()}
    payload |= {"ram_bytes": psutil.virtual_memory().total}
    payload |= {"args": {k: str(v) for k, v in vars(args).items()}, "builds": [b.to_dict() for b in builds]}
    payload |= {"data": data, "rows": [r.to_dict() for r in rows], "scaling": [r.to_dict() for r in scaling]}
    targets_json = [dict(zip(("target", "where", "measured", "pass"), t)) for t in targets]
    write_json(args.json, payload | {"read_path": probes, "targets": targets_json})
    return 0 if all(t[3] for t in targets) else 1


COMMANDS = {"loaders": main}
