"""``tools/bench.py profile`` (the sampler of ``tools/bench_harness.py``), run on real subprocesses."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"
PY = sys.executable
MIB = 2**20
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def hog(mib: int, hold_s: float) -> str:
    """Python source that touches ``mib`` MiB and keeps it for ``hold_s`` s."""
    return f"import time; b = b'x' * ({mib} * 2**20); time.sleep({hold_s})"


PARENT_OF_TWO = f"""
import subprocess, sys
kids = [subprocess.Popen([sys.executable, '-c', {hog(100, 0.8)!r}]) for _ in range(2)]
sys.exit(max(k.wait() for k in kids))
"""


def run_tool(*args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PY, str(TOOLS / "bench.py"), "profile", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def table_rows(stderr: str) -> list[list[str]]:
    """Data rows of the markdown table in the tool's stderr."""
    lines = [ln for ln in stderr.splitlines() if ln.startswith("|")]
    assert lines[0].startswith("| command |") and lines[1].startswith("|---")
    return [[c.strip() for c in ln.strip("|").split(" | ")] for ln in lines[2:]]


def load_module():
    spec = importlib.util.spec_from_file_location("bench_harness", TOOLS / "bench_harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


def test_single_command_peak_plot_and_json(tmp_path: Path) -> None:
    png, out = tmp_path / "mem.png", tmp_path / "mem.json"
    res = run_tool("--plot", png, "--json", out, "--", PY, "-c", hog(200, 0.5))
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    [row] = table_rows(res.stderr)
    assert row[1] == "0"
    assert float(row[3]) >= 190  # peak RSS, tree (MiB)

    assert png.read_bytes()[:8] == PNG_MAGIC
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[0] > 200

    [prof] = json.loads(out.read_text())["profiles"]
    summary, samples = prof["summary"], prof["samples"]
    assert summary["exit_code"] == 0
    assert summary["peak_rss_tree_bytes"] >= 190 * MIB
    assert summary["peak_rss_main_bytes"] == summary["peak_rss_tree_bytes"]
    assert summary["kernel_max_rss_bytes"] >= 190 * MIB
    assert summary["peak_pss_tree_bytes"] >= 180 * MIB  # Linux exposes PSS
    assert summary["minor_faults"] > 190 * MIB // 4096  # each page touched once
    assert summary["wall_s"] >= 0.5 and summary["user_s"] + summary["sys_s"] > 0
    n = summary["samples"]
    assert n >= 5
    assert all(len(v) == n for v in samples.values())
    assert samples["t_s"] == sorted(samples["t_s"])


def test_tree_sums_children() -> None:
    res = run_tool("--", PY, "-c", PARENT_OF_TWO)
    assert res.returncode == 0, res.stderr
    [row] = table_rows(res.stderr)
    peak_tree, peak_main, kernel_max = float(row[3]), float(row[5]), float(row[6])
    assert kernel_max >= 100  # the largest single process: one child
    assert peak_tree >= 1.8 * kernel_max  # both children at once, plus the parent
    assert peak_main < 60  # the parent itself stays small
    assert int(row[11]) >= 3  # parent and two children seen


@pytest.mark.parametrize(
    ("code", "expected"),
    [("import sys; sys.exit(3)", 3), ("import os; os.kill(os.getpid(), 9)", 128 + 9)],
)
def test_exit_code_propagated(code: str, expected: int) -> None:
    res = run_tool("--interval", "0.01", "--", PY, "-c", code)
    assert res.returncode == expected, res.stderr
    [row] = table_rows(res.stderr)
    assert row[1] == str(expected)


@pytest.mark.parametrize(("to_group", "signum"), [(True, signal.SIGINT), (False, signal.SIGTERM)])
def test_interrupted_command_is_still_reported(tmp_path: Path, to_group: bool, signum: int) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) or a SIGTERM to the
    profiler ends the command, and its profile is still reported."""
    started = tmp_path / "started"
    code = f"import time; open({str(started)!r}, 'w').close(); time.sleep(30)"
    tool = subprocess.Popen(
        [PY, str(TOOLS / "bench.py"), "profile", "--", PY, "-c", code],
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    if to_group:
        os.killpg(tool.pid, signum)
    else:
        tool.send_signal(signum)
    _, stderr = tool.communicate(timeout=20)
    assert tool.returncode == 128 + signum, stderr
    [row] = table_rows(stderr)
    assert row[1] == str(128 + signum)


def test_compare_two_commands(tmp_path: Path) -> None:
    png, out = tmp_path / "cmp.png", tmp_path / "cmp.json"
    res = run_tool(
        "--plot",
        png,
        "--json",
        out,
        "--label",
        "big",
        "--label",
        "small",
        "--",
        PY,
        "-c",
        hog(150, 0.3),
        ":::",
        PY,
        "-c",
        "import sys; sys.exit(5)",
    )
    assert res.returncode == 5, res.stderr  # the first non-zero exit code
    rows = table_rows(res.stderr)
    assert [r[0] for r in rows] == ["big", "small"]
    assert [r[1] for r in rows] == ["0", "5"]
    assert png.read_bytes()[:8] == PNG_MAGIC
    profiles = json.loads(out.read_text())["profiles"]
    assert [p["label"] for p in profiles] == ["big", "small"]
    assert profiles[0]["summary"]["peak_rss_tree_bytes"] > 140 * MIB
    assert profiles[1]["summary"]["peak_rss_tree_bytes"] < 100 * MIB


def test_plot_one_series_per_command() -> None:
    pm = load_module()
    profiles = [
        pm.profile([PY, "-c", hog(60, 0.2)], interval=0.02, label="a"),
        pm.profile([PY, "-c", PARENT_OF_TWO.replace("100", "20")], 0.02, label="b"),
    ]
    assert profiles[0].peak_rss_tree >= 55 * MIB
    fig = pm.plot(profiles)
    [ax] = fig.axes
    labels = [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]
    assert [lab.split(":")[0] for lab in labels].count("a") == 2  # RSS and PSS
    assert [lab.split(":")[0] for lab in labels].count("b") == 3  # + main process
    assert "MiB" in ax.get_ylabel() and "(s)" in ax.get_xlabel() and ax.get_title()
    assert ax.get_legend() is not None
    assert "| a |" in pm.profile_table(profiles)


@pytest.mark.parametrize(
    ("name", "mode", "code", "message"),
    [
        ("no-such-command-xyz", None, 127, "command not found"),
        ("plain.txt", 0o644, 126, "not executable"),
        ("noshebang", 0o755, 126, "Exec format error"),  # fails in exec itself
    ],
)
def test_unstartable_command_is_one_line_error(
    tmp_path: Path, name: str, mode: int | None, code: int, message: str
) -> None:
    cmd = name
    if mode is not None:
        path = tmp_path / name
        path.write_text("not a program\n")
        path.chmod(mode)
        cmd = str(path)
    res = run_tool("--", cmd)
    assert res.returncode == code
    assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    assert res.stderr.startswith("bench.py profile: error:") and "Traceback" not in res.stderr


def test_compare_checks_every_command_before_running(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    res = run_tool("--", PY, "-c", f"open({str(marker)!r}, 'w')", ":::", "no-such-command-xyz")
    assert res.returncode == 127 and "no-such-command-xyz" in res.stderr
    assert not marker.exists()


@pytest.mark.parametrize(
    "args",
    [
        [],  # no command
        ["--", PY, ":::"],  # empty second command
        ["--label", "x", "--", PY, ":::", PY],  # one label for two commands
        ["--interval", "0", "--", PY],
    ],
)
def test_usage_errors(args: list[str]) -> None:
    res = run_tool(*args)
    assert res.returncode == 2
    assert "usage:" in res.stderr and "Traceback" not in res.stderr
