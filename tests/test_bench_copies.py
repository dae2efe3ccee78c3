"""``tools/bench.py copies`` on a tiny cache: both sides run, the table has one row each and the pairs' ratio."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_tiny_paired_run_prints_both_sides_and_their_ratio(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "tools/bench.py"), "copies", "--baseline", str(ROOT), "--rounds", "1"]
    cmd += ["--epochs", "1", "--bars", "3000", "--features", "3", "--work", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    rows = [ln.split("|")[1:-1] for ln in out.stdout.splitlines() if ln.startswith("| ") and "side" not in ln]
    assert [r[0].strip() for r in rows] == ["new", "old"]
    assert rows[0][1].strip() == rows[1][1].strip() != "0"  # the same windows on both sides
    assert rows[0][3].strip().endswith(")") and rows[0][3].strip()[0].isdigit() and rows[1][3].strip() == "-"
    assert "load average" in out.stdout and not (tmp_path / "copies-folder").exists()


def test_a_round_count_below_one_is_refused(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools/bench.py"), "copies", "--rounds", "0", "--work", str(tmp_path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode != 0 and "must be at least 1" in out.stderr
