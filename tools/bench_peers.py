"""The peers in the benchmark: LitData and MosaicML Streaming against E (``WindowStream``) on the same bars.

``tools/bench.py --peers`` (``make bench-peers``) runs this instead of the main benchmark. The
peers cannot gather windows out of shared bars, so they are used as their users would: one
sample per window, ``{"x": bars[p:p+60], "y": bars[p+60]}`` float32 arrays, written once

L  LitData: ``litdata.optimize(fn, inputs=starts, chunk_bytes="64MB")`` (its default
   ``num_workers``, one process per core), read with ``StreamingDataset(shuffle=True)`` and
   ``StreamingDataLoader(batch_size=256, num_workers=0)``;
M  MosaicML Streaming: ``MDSWriter(columns={"x": "ndarray:float32:60,F", "y": ...})`` (its
   defaults: no compression, 64 MiB shards), read with ``StreamingDataset(shuffle=True,
   batch_size=256)`` and ``DataLoader(batch_size=256, num_workers=0)``;

and timed against E, ``WindowStream(cache, 60, horizon=1, split="all", batch_size=256,
shuffle=True)`` in-process over the compressed cache, serving the same number of windows
(E shuffles the whole cache; its batches are cut off after that many windows).

A sample per window stores each bar 60 times: 665K windows x 61 rows x F float32 is 9.8 GB
per peer at F=64 and 39 GB at F=256. The peers are therefore written ``--peer-windows``
windows (the first ones, in time order; 0: all), which the report states; the run refuses to
start when the disk lacks room for them. Each write and each read is its own process under
``profile()`` (RSS and PSS of the process tree, LitData's optimize workers included);
``--rounds`` interleaved rounds of E, L and M at every F; windows/s is the best round's, first
batch (from constructing the dataset to the first batch in hand) the worst round's, memory the
highest peak. Every process runs one torch thread. The written samples are deleted at the end.

The peers live in their own venv (``.venv-peers``) with torch pinned by
``tools/peers-constraints.txt``. Both peers require ``torchvision``, and PyPI's torchvision
wheel is a CUDA build that cannot load against the CPU torch (``import torchvision`` raises
"operator torchvision::nms does not exist"); ``make bench-peers`` removes it. ``import
streaming`` imports its image datasets (``streaming.vision``, torchvision-based, unused here):
without torchvision a placeholder module stands in for that one subpackage, and the report says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_build import BuildResult, build_table, dir_bytes, prepare_data
from bench_harness import BATCH, GIB, HORIZON, SEQ_LEN, Row, run_profiled, timed
from profile_memory import MIB

__all__ = ["PEER_SCENARIOS", "WindowSample", "import_streaming", "peers_main"]

DISK_MARGIN = 2 * GIB  # left free beyond the peers' samples
PEER_NAMES = {"E": "E WindowStream w=0", "L": "LitData w=0", "M": "MosaicML Streaming w=0"}


class WindowSample:
    """LitData's ``fn``: window ``p`` and its target row, as a user would write it; picklable for its workers."""

    def __init__(self, raw: str, n_bars: int, f: int) -> None:
        self.raw, self.shape = raw, (n_bars, f)
        self._rows: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_rows": None}  # each worker maps the file itself

    def __call__(self, p: int) -> dict[str, np.ndarray]:
        if self._rows is None:
            self._rows = np.memmap(self.raw, np.float32, "r", shape=self.shape)
        return {"x": np.array(self._rows[p : p + SEQ_LEN]), "y": np.array(self._rows[p + SEQ_LEN])}


def import_streaming() -> tuple[types.ModuleType, str]:
    """``import streaming`` and a note: without torchvision, ``streaming.vision`` is a placeholder.

    ``streaming/__init__`` imports its ImageNet/COCO datasets, which import torchvision;
    ``MDSWriter`` and ``StreamingDataset`` never do. A torchvision that is installed but cannot
    load (PyPI's CUDA wheel on a CPU torch) is an error here, not something to paper over.
    """
    note = "torchvision present"
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        sys.modules["streaming.vision"] = types.ModuleType(
            "streaming.vision", "placeholder: torchvision is not installed"
        )
        note = "no torchvision: `streaming.vision` (image datasets) replaced by an empty placeholder module"
    except Exception as exc:  # the CUDA wheel on a CPU torch: RuntimeError "operator torchvision::nms does not exist"
        raise SystemExit(
            f"bench: torchvision is installed but cannot load against torch {torch.__version__} ({exc}); "
            "`pip uninstall torchvision` in this venv (see `make bench-peers`)"
        ) from exc
    import streaming

    return streaming, note


# -- scenario processes (run by bench.py --scenario) -------------------------------------------
def _peer_starts(spec: dict) -> np.ndarray:
    """The first ``windows`` valid starts (all when 0), the windows the peers are written."""
    starts = np.load(spec["starts"])
    return starts[: spec["windows"] or None]


def _litdata_write(spec: dict) -> dict[str, Any]:
    """L: ``optimize`` one sample per window into ``dir``, with LitData's default workers."""
    from litdata import optimize

    starts = _peer_starts(spec)
    t0 = time.perf_counter()
    optimize(
        fn=WindowSample(spec["raw"], spec["n_bars"], spec["F"]),
        inputs=starts.tolist(),
        output_dir=spec["dir"],
        chunk_bytes="64MB",
        verbose=False,
    )
    return {"write_s": time.perf_counter() - t0, "windows": len(starts), "bytes": dir_bytes(Path(spec["dir"]))}


def _mosaic_write(spec: dict) -> dict[str, Any]:
    """M: ``MDSWriter`` one sample per window into ``dir``, with its default shard size and no compression."""
    streaming, _ = import_streaming()
    starts, f = _peer_starts(spec), spec["F"]
    rows = np.memmap(spec["raw"], np.float32, "r", shape=(spec["n_bars"], f))
    columns = {"x": f"ndarray:float32:{SEQ_LEN},{f}", "y": f"ndarray:float32:{f}"}
    t0 = time.perf_counter()
    with streaming.MDSWriter(out=spec["dir"], columns=columns) as out:
        for p in starts.tolist():
            out.write({"x": np.array(rows[p : p + SEQ_LEN]), "y": np.array(rows[p + SEQ_LEN])})
    return {"write_s": time.perf_counter() - t0, "windows": len(starts), "bytes": dir_bytes(Path(spec["dir"]))}


def _litdata_read(spec: dict) -> dict[str, Any]:
    """L: ``StreamingDataset(shuffle=True)`` through ``StreamingDataLoader`` in-process."""
    from litdata import StreamingDataLoader, StreamingDataset

    def open_data() -> Iterator[tuple]:
        ds = StreamingDataset(spec["dir"], shuffle=True, seed=spec["round"])
        for batch in StreamingDataLoader(ds, batch_size=BATCH, num_workers=0):
            yield batch["x"], batch["y"]

    return timed(open_data)


def _mosaic_read(spec: dict) -> dict[str, Any]:
    """M: ``StreamingDataset(shuffle=True, batch_size=256)`` through a plain ``DataLoader`` in-process."""
    streaming, note = import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # what its docs advise after an interrupted run

    def open_data() -> Iterator[tuple]:
        ds = streaming.StreamingDataset(local=spec["dir"], shuffle=True, shuffle_seed=spec["round"], batch_size=BATCH)
        for batch in DataLoader(ds, batch_size=BATCH, num_workers=0):
            yield batch["x"], batch["y"]

    return {**timed(open_data), "note": note}


PEER_SCENARIOS = {
    "litdata_write": _litdata_write,
    "mosaic_write": _mosaic_write,
    "litdata_read": _litdata_read,
    "mosaic_read": _mosaic_read,
}


# -- parent ----------------------------------------------------------------------------------
def _uptime() -> str:
    """The machine's load as ``uptime`` prints it."""
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _check_disk(work: Path, data: dict[int, dict], windows: int) -> None:
    """Refuse to start when the two peers' samples would not fit on the disk (with a margin)."""
    need = sum(2 * min(windows or d["n_windows"], d["n_windows"]) * (SEQ_LEN + 1) * d["F"] * 4 for d in data.values())
    free = shutil.disk_usage(work).free
    if need + DISK_MARGIN > free:
        raise SystemExit(
            f"bench: the peers' samples need ~{need / GIB:.1f} GiB under {work}, "
            f"{free / GIB:.1f} GiB free: lower --peer-windows or --features"
        )


def _versions() -> str:
    """torch, LitData and MosaicML Streaming versions, and how ``streaming`` was imported."""
    try:
        import litdata
    except ModuleNotFoundError:
        raise SystemExit(
            "bench: --peers needs litdata and mosaicml-streaming: run `make bench-peers` "
            "(it installs them into .venv-peers)"
        ) from None

    streaming, note = import_streaming()
    return (
        f"torch {torch.__version__}, litdata {litdata.__version__}, mosaicml-streaming {streaming.__version__} ({note})"
    )


def _table(rows: list[Row], writes: dict[tuple[int, str], dict]) -> str:
    """E, L and M side by side at each F: windows/s, ratio to E, first batch, memory, write time, disk."""
    lines = [
        (
            "| scenario | F | windows timed | windows/s | vs E | first batch s | peak RSS MiB | peak PSS MiB | "
            "written in s | on disk MiB |"
        ),
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        f = r.spec["F"]
        e = next(x for x in rows if x.key == "E" and x.spec["F"] == f)
        pss = "n/a" if r.peak_pss is None else f"{r.peak_pss / MIB:,.0f}"
        w = writes.get((f, r.key))
        written = "(build above)" if w is None else f"{w['write_s']:,.1f}"
        disk = r.disk if w is None else w["bytes"]
        lines.append(
            f"| {PEER_NAMES[r.key]} | {f} | {r.result['windows']:,} | {r.rate:,.0f} | {r.rate / e.rate:.3f}x | "
            f"{r.first_s:.3f} | {r.prof.peak_rss_tree / MIB:,.0f} | {pss} | {written} | {disk / MIB:,.1f} |"
        )
    return "\n".join(lines)


def peers_main(args: argparse.Namespace) -> int:
    """Build the caches, write the peers' samples, time E, L and M in interleaved rounds, print the table."""
    t_start, load_before = time.perf_counter(), _uptime()
    versions = _versions()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    builds: list[BuildResult] = []
    data = {
        f: prepare_data(work, f, builds, SEQ_LEN, HORIZON) for f in sorted(int(x) for x in args.features.split(","))
    }
    _check_disk(work, data, args.peer_windows)
    peers_dir = work / "peers"
    shutil.rmtree(peers_dir, ignore_errors=True)
    writes: dict[tuple[int, str], dict] = {}
    specs: dict[tuple[int, str], tuple[str, dict, int]] = {}
    try:
        for f, d in data.items():
            n = min(args.peer_windows or d["n_windows"], d["n_windows"])
            base = {k: d[k] for k in ("F", "raw", "starts", "cache", "n_bars")}
            specs[f, "E"] = ("stream", {**base, "batches": -(-n // BATCH), "workers": 0}, d["cache_bytes"])
            for key, name in (("L", "litdata"), ("M", "mosaic")):
                spec = {**base, "windows": n, "dir": str(peers_dir / f"{name}-{f}"), "round": 0}
                result, prof = run_profiled(f"{name}_write", f"{PEER_NAMES[key]} write F={f}", spec, work)
                writes[f, key] = {**result, "peak_rss_tree_bytes": prof.peak_rss_tree}
                specs[f, key] = (f"{name}_read", spec, result["bytes"])
        table: dict[tuple[int, str], Row] = {}
        for rnd in range(args.rounds):
            for (f, key), (kind, spec, disk) in specs.items():
                label = f"{PEER_NAMES[key]} F={f}"
                row = table.setdefault((f, key), Row(key, label, spec, disk))
                row.add(*run_profiled(kind, f"{label} #{rnd + 1}", {**spec, "round": rnd}, work))
    finally:
        shutil.rmtree(peers_dir, ignore_errors=True)
    rows = list(table.values())
    load_after = _uptime()
    counts = ", ".join(
        f"F={f}: {min(args.peer_windows or d['n_windows'], d['n_windows']):,} of {d['n_windows']:,}"
        for f, d in data.items()
    )
    report = [
        (
            f"shardcache against its peers, {time.strftime('%Y-%m-%d')}: {psutil.cpu_count()} cores, "
            f"{psutil.virtual_memory().total / GIB:.0f} GiB RAM, {platform.python_implementation()} {platform.python_version()}, "
            f"{versions}; seq_len {SEQ_LEN}, batch {BATCH}, shuffle on, num_workers=0; 1 torch thread per process; "
            f"{args.rounds} interleaved rounds; total run {time.perf_counter() - t_start:.0f} s."
        ),
        "",
        f"Load (`uptime`) before: `{load_before}`; after: `{load_after}`.",
        "",
        "### Builds (E's caches)",
        "",
        build_table(builds),
        "",
        "### Peers (same bars, same run)",
        "",
        _table(rows, writes),
        "",
        (
            f"Windows timed per scenario ({counts}): the peers are written that many windows, one sample each "
            "(the first ones in time order); E streams the whole cache, shuffled, and stops after as many. windows/s is "
            "the best round's, first batch (constructing the dataset to the first batch in hand) the worst round's, "
            "memory the highest peak of the process tree; `written in s` is the peer's one write (LitData's with its "
            "worker processes)."
        ),
    ]
    print("\n".join(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "date": time.strftime("%Y-%m-%d"),
            "versions": versions,
            "load_before": load_before,
            "load_after": load_after,
            "args": {k: str(v) for k, v in vars(args).items()},
            "builds": [b.to_dict() for b in builds],
            "data": data,
            "writes": {f"{f} {k}": v for (f, k), v in writes.items()},
            "rows": [r.to_dict() for r in rows],
        }
        args.json.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    return 0
