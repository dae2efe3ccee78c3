"""Users' type checkers see shardcache's annotations: the wheel ships ``py.typed`` (PEP 561), and the
names ``shardcache`` loads on first use (``WindowStream``, ``build_cache``, ...) type-check as what
they are, not as the ``Any`` of the module's lazy ``__getattr__``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the third-party stubs (torch, numpy, zarr) checked once per checkout, not once per run
CACHE = ROOT / ".mypy_cache" / "users-of-the-wheel"

USER = """\
import shardcache


def train(path: str) -> int:
    cache = shardcache.open_cache(path)
    stream = shardcache.WindowStream(cache, seq_len=60, batch_size=256)
    n = 0
    for batch in stream:
        n += batch.x.shape[0]
    return n


def build(paths: list[str]) -> shardcache.Cache:
    return shardcache.build_cache(paths, "out.zarr", shard_rows=4096)


options = shardcache.BuildOptions(split="train=0.8,val=0.2")
stream: str = shardcache.WindowStream("cache.zarr", seq_len=60)
cache: int = shardcache.build_cache(["a.dbn"], "out.zarr")
shardcache.WindowStream("cache.zarr", seq_len="60")
shardcache.open_cache(42)
"""
# each misuse above, as mypy words it: (line, the start of its message)
MISUSES = [
    (18, 'Incompatible types in assignment (expression has type "WindowStream", variable has type "str")'),
    (19, 'Incompatible types in assignment (expression has type "Cache", variable has type "int")'),
    (20, 'Argument "seq_len" to "WindowStream" has incompatible type "str"'),
    (21, 'Argument 1 to "open_cache" has incompatible type "int"'),
]


def _wheel(tmp_path: Path) -> Path:
    """The package built as a wheel from a copy of the sources (the checkout stays as it is)."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "shardcache", src / "shardcache", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src), "-w", "dist"]
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    (wheel,) = (tmp_path / "dist").glob("shardcache-*.whl")
    return wheel


def test_a_user_of_the_installed_wheel_gets_shardcache_types(tmp_path):
    wheel = _wheel(tmp_path)
    assert "shardcache/py.typed" in zipfile.ZipFile(wheel).namelist()
    site = tmp_path / "site"  # the wheel installed, and nothing else of shardcache on the path
    zipfile.ZipFile(wheel).extractall(site)
    (tmp_path / "user.py").write_text(USER)
    env = {**os.environ, "PYTHONPATH": str(site)}
    cmd = [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(CACHE), "--no-error-summary", "user.py"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900, check=False)
    errors = [line for line in done.stdout.splitlines() if ": error: " in line]
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(errors) == len(MISUSES), "\n".join(errors)
    for got, (line, message) in zip(errors, MISUSES):
        assert got.startswith(f"user.py:{line}: error: {message}"), got
