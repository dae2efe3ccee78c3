"""tools/bench_peers.py's parts (``tools/bench.py peers``) that need no peer installed: the window sample, the disk check, the refusal."""

from __future__ import annotations

import importlib.util
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
import bench_peers


def test_window_sample_is_the_window_and_its_target_and_pickles_without_its_map(tmp_path: Path) -> None:
    rows = np.arange(200 * 3, dtype=np.float32).reshape(200, 3)
    raw = tmp_path / "rows.f32"
    rows.tofile(raw)
    fn = bench_peers.WindowSample(str(raw), 200, 3)
    first = fn(5)
    np.testing.assert_array_equal(first["x"], rows[5:65])
    np.testing.assert_array_equal(first["y"], rows[65])
    assert fn._rows is not None
    clone = pickle.loads(pickle.dumps(fn))  # what LitData's optimize workers receive
    assert clone._rows is None
    np.testing.assert_array_equal(clone(139)["x"], rows[139:199])
    assert isinstance(first["x"], np.ndarray) and not isinstance(first["x"], np.memmap)


def test_disk_check_refuses_samples_that_do_not_fit(tmp_path: Path) -> None:
    huge = {256: {"F": 256, "n_windows": 10**9}}
    with pytest.raises(SystemExit, match="lower --peer-windows"):
        bench_peers._check_disk(tmp_path, huge, 0)
    bench_peers._check_disk(tmp_path, huge, 16)  # 16 windows fit


@pytest.mark.skipif(importlib.util.find_spec("litdata") is not None, reason="the peers are installed here")
def test_peers_without_the_peers_venv_is_a_one_line_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(TOOLS / "bench.py"), "peers", "--work", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "bench: peers needs litdata and mosaicml-streaming: run `make bench-peers` (it installs them into .venv-peers)"
    )
    assert not list(tmp_path.iterdir())  # refused before building anything
