"""``bench.py peers`` (``make bench-peers``): LitData and MosaicML Streaming against E (``WindowStream``), same bars.

The peers cannot gather windows out of shared bars, so they are used as their users would: one sample per window,
``{"x": bars[p:p+60], "y": bars[p+60]}``, written once (**L** LitData's ``optimize(chunk_bytes="64MB")``, its default
workers; **M** Mosaic's ``MDSWriter``, its defaults) and read shuffled in batches of 256 with ``num_workers=0``
(``StreamingDataset`` through ``StreamingDataLoader`` or ``DataLoader``), against E in-process, cut off after as many
windows. A sample per window stores each bar 60 times (39 GB per peer at F=256): the peers get the first
``--peer-windows`` windows, and the run refuses to start without the disk room. Every write and read is a profiled
process, one torch thread, ``--rounds`` interleaved rounds; the samples are deleted at the end. The peers live in
``.venv-peers`` (torch pinned by ``tools/peers-constraints.txt``); PyPI's CUDA torchvision cannot load on the CPU
torch, so ``make bench-peers`` removes it and ``streaming.vision`` (its only user) gets a placeholder module.
"""

from __future__ import annotations

import shutil
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_builds import BuildResult, build_table, dir_bytes, prepare_data
from bench_harness import BATCH, GIB, MIB, SEQ_LEN, Row, load, machine, parser, run, table, timed, write_json
from torch.utils.data import DataLoader

__all__ = ["CHILDREN", "COMMANDS", "WindowSample", "import_streaming", "main"]

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
    """``import streaming`` and a note: without torchvision, ``streaming.vision`` is a placeholder (``MDSWriter``
    and ``StreamingDataset`` never use it). A torchvision that is installed but cannot load is an error."""
    note = "torchvision present"
    try:
        import torchvision  # noqa: F401
    except ModuleNotFoundError:
        sys.modules["streaming.vision"] = types.ModuleType("streaming.vision", "placeholder: no torchvision")
        note = "no torchvision: `streaming.vision` (image datasets) replaced by an empty placeholder module"
    except Exception as exc:  # the CUDA wheel on a CPU torch: RuntimeError "operator torchvision::nms does not exist"
        raise SystemExit(
            f"bench: torchvision is installed but cannot load against torch {torch.__version__} ({exc}); "
            "`pip uninstall torchvision` in this venv (see `make bench-peers`)"
        ) from exc
    import streaming

    return streaming, note


# -- scenario processes ----------------------------------------------------------------------
def _write(spec: dict) -> dict[str, Any]:
    """L or M: one sample per window of the first ``windows`` into ``dir``, with the peer's defaults."""
    starts, f, t0 = np.load(spec["starts"])[: spec["windows"] or None], spec["F"], time.perf_counter()
    if spec["kind"] == "litdata_write":
        from litdata import optimize

        sample = WindowSample(spec["raw"], spec["n_bars"], f)
        optimize(fn=sample, inputs=starts.tolist(), output_dir=spec["dir"], chunk_bytes="64MB", verbose=False)
    else:
        streaming, _ = import_streaming()
        rows = np.memmap(spec["raw"], np.float32, "r", shape=(spec["n_bars"], f))
        columns = {"x": f"ndarray:float32:{SEQ_LEN},{f}", "y": f"ndarray:float32:{f}"}
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


CHILDREN = {"litdata_write": _write, "mosaic_write": _write, "litdata_read": _litdata_read, "mosaic_read": _mosaic_read}


# -- the parent ------------------------------------------------------------------------------
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
            "bench: peers needs litdata and mosaicml-streaming: run `make bench-peers` (it installs them into .venv-peers)"
        ) from None
    streaming, note = import_streaming()
    return (
        f"torch {torch.__version__}, litdata {litdata.__version__}, mosaicml-streaming {streaming.__version__} ({note})"
    )


def _table(rows: list[Row], writes: dict[tuple[int, str], dict]) -> str:
    """E, L and M side by side at each F: windows/s, ratio to E, first batch, memory, write time, disk."""
    head = ["scenario", "F", "windows timed", "windows/s", "vs E", "first batch s", "peak RSS MiB", "peak PSS MiB"]
    out = []
    for r in rows:
        f, w = r.spec["F"], writes.get((r.spec["F"], r.key))
        e = next(x for x in rows if x.key == "E" and x.spec["F"] == f)
        written, disk = ("(build above)", r.disk) if w is None else (f"{w['write_s']:,.1f}", w["bytes"])
        row = [PEER_NAMES[r.key], f, f"{r.result['windows']:,}", f"{r.rate:,.0f}", f"{r.rate / e.rate:.3f}x"]
        out.append([*row, f"{r.first_s:.3f}", *r.memory(), written, f"{disk / MIB:,.1f}"])
    return table([*head, "written in s", "on disk MiB"], out)


def main(argv: list[str]) -> int:
    """Build the caches, write the peers' samples, time E, L and M in interleaved rounds, print the table."""
    args = parser(
        *("peers", __doc__, "work", "json"),
        features=("9,64,256", "feature counts to run"),
        rounds=(3, "rounds over all scenarios, interleaved"),
        peer_windows=(131_072, "windows written to each peer, one sample each; 0: all"),
    ).parse_args(argv)
    t_start, load_before, versions = time.perf_counter(), load(), _versions()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    builds: list[BuildResult] = []
    data = {f: prepare_data(work, f, builds) for f in sorted(int(x) for x in args.features.split(","))}
    _check_disk(work, data, args.peer_windows)
    peers_dir = work / "peers"
    shutil.rmtree(peers_dir, ignore_errors=True)
    writes: dict[tuple[int, str], dict] = {}
    specs: dict[tuple[int, str], tuple[str, str, dict, int]] = {}
    found: dict[tuple[int, str], Row] = {}
    try:
        for f, d in data.items():
            n = min(args.peer_windows or d["n_windows"], d["n_windows"])
            base = {k: d[k] for k in ("F", "raw", "starts", "cache", "n_bars")}
            specs[f, "E"] = (
                "bench_loaders",
                "stream",
                {**base, "batches": -(-n // BATCH), "workers": 0},
                d["cache_bytes"],
            )
            for key, name in (("L", "litdata"), ("M", "mosaic")):
                spec = {**base, "windows": n, "dir": str(peers_dir / f"{name}-{f}"), "round": 0}
                result, prof = run("bench_peers", f"{name}_write", spec, f"{PEER_NAMES[key]} write F={f}")
                writes[f, key] = {**result, "peak_rss_tree_bytes": prof.peak_rss_tree}
                specs[f, key] = ("bench_peers", f"{name}_read", spec, result["bytes"])
        for rnd in range(args.rounds):
            for (f, key), (module, kind, spec, disk) in specs.items():
                label = f"{PEER_NAMES[key]} F={f}"
                row = found.setdefault((f, key), Row(key, label, spec, disk))
                row.add(*run(module, kind, {**spec, "round": rnd}, f"{label} #{rnd + 1}"))
    finally:
        shutil.rmtree(peers_dir, ignore_errors=True)
    rows, load_after = list(found.values()), load()
    counts = ", ".join(
        f"F={f}: {min(args.peer_windows or d['n_windows'], d['n_windows']):,} of {d['n_windows']:,}"
        for f, d in data.items()
    )
    head = f"shardcache against its peers, {time.strftime('%Y-%m-%d')}: {machine()}, {versions}; seq_len {SEQ_LEN}, "
    head += f"batch {BATCH}, shuffle on, num_workers=0; 1 torch thread per process; {args.rounds} interleaved "
    head += f"rounds; total run {time.perf_counter() - t_start:.0f} s."
    note = f"Windows timed per scenario ({counts}): the peers are written that many windows, one sample each (the "
    note += "first ones in time order); E streams the whole cache, shuffled, and stops after as many. windows/s is the "
    note += "best round's, first batch (constructing the dataset to the first batch in hand) the worst round's, memory "
    note += "the highest peak of the process tree; `written in s` is the peer's one write (LitData's with its worker "
    note += "processes)."
    report = [head, "", f"Load (`uptime`) before: `{load_before}`; after: `{load_after}`.", ""]
    report += ["### Builds (E's caches)", "", build_table(builds), "", "### Peers (same bars, same run)", ""]
    print("\n".join([*report, _table(rows, writes), "", note]))
    payload = {"date": time.strftime("%Y-%m-%d"), "versions": versions, "load_before": load_before}
    payload |= {"load_after": load_after, "args": {k: str(v) for k, v in vars(args).items()}}
    payload |= {"builds": [b.to_dict() for b in builds], "data": data, "rows": [r.to_dict() for r in rows]}
    write_json(args.json, payload | {"writes": {f"{f} {k}": v for (f, k), v in writes.items()}})
    return 0


COMMANDS = {"peers": main}
