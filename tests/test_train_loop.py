"""``tools/bench.py train`` on a tiny cache: every scenario runs in its own process and trains on the same batches."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "bench.py"
SCENARIOS = ["model", "stream", "dataloader", "loader", "model-1t", "stream-1t", "dataloader-1t", "loader-1t"]


def _tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), "train", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_two_steps_of_every_scenario_give_one_table_row_each(stream_cache, tmp_path: Path) -> None:
    out = _tool(
        "--cache",
        str(stream_cache.url),
        "--batches",
        "2",
        "--rounds",
        "1",
        "--work",
        str(tmp_path),
        "--json",
        str(tmp_path / "loop.json"),
    )
    assert out.returncode == 0, out.stderr
    rows = [
        line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| ") and "scenario" not in line
    ]
    assert [r[0].strip() for r in rows] == SCENARIOS
    assert {(r[1].strip(), r[2].strip()) for r in rows} == {("5", "2")}  # F and steps
    assert [r[4].strip() for r in rows if r[0].strip().startswith("model")] == ["1.00x", "1.00x"]
    assert "load before:" in out.stdout and "load after:" in out.stdout and "default threads" in out.stdout

    results = {r["kind"]: r for r in json.loads((tmp_path / "loop.json").read_text())["results"]}
    assert all(results[k]["torch_threads"] == 1 for k in SCENARIOS if k.endswith("-1t"))
    assert results["stream"]["torch_threads"] == results["model"]["torch_threads"]
    # the same initial weights and the same batches in the same order: the same loss after two steps
    losses = [results[k]["loss"] for k in SCENARIOS]
    assert losses == pytest.approx([losses[0]] * len(SCENARIOS), rel=1e-4)
    assert all(r["utime"] > 0 and r["peak_rss"] > 0 for r in results.values())


def test_more_batches_than_an_epoch_is_refused_before_any_run(stream_cache, tmp_path: Path) -> None:
    out = _tool("--cache", str(stream_cache.url), "--batches", "100000", "--work", str(tmp_path))
    assert out.returncode != 0
    assert "--batches 100000 is more than the" in out.stderr
    assert not (tmp_path / "results").exists()


def _spinners() -> set[int]:
    import psutil

    return {
        p.pid for p in psutil.process_iter(["cmdline"]) if "multiprocessing.spawn" in " ".join(p.info["cmdline"] or [])
    }


def test_busy_runs_beside_spinning_processes_and_stops_them(stream_cache, tmp_path: Path) -> None:
    """``--busy 1``: the header says so, the JSON records it, and no spinning process outlives the tool."""
    before = _spinners()
    out = _tool(
        "--cache", str(stream_cache.url), "--batches", "2", "--rounds", "1", "--scenarios", "model", "model-1t",
        "--busy", "1", "--work", str(tmp_path), "--json", str(tmp_path / "loop.json"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "1 spinning processes beside the runs (--busy)" in out.stdout
    assert json.loads((tmp_path / "loop.json").read_text())["busy"] == 1
    assert _spinners() <= before


def test_a_negative_busy_is_refused(stream_cache, tmp_path: Path) -> None:
    out = _tool("--cache", str(stream_cache.url), "--busy", "-1", "--work", str(tmp_path))
    assert out.returncode != 0 and "--busy at least 0" in out.stderr
