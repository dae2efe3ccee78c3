"""The install and the process: a library call leaves the allocator alone, the CLI tunes it, and
a core install without the build extra says what to install."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import shardcache
from shardcache.ingest import tasks

ROOT = Path(__file__).resolve().parents[1]

# Whether glibc's mmap threshold is pinned, seen from its behaviour: a dynamic threshold rises to
# the size of a freed mmapped block, so a 16 MiB block after a freed 24 MiB one comes from the heap;
# pinned at 128 KiB, it is mmapped (mallinfo2's hblks grows).
PROBE = """
import ctypes, json, sys
class _Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
_libc = ctypes.CDLL(None)
_libc.mallinfo2.restype = _Info
_libc.malloc.restype, _libc.malloc.argtypes, _libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
def mmap_threshold_pinned():
    _libc.free(_libc.malloc(24 << 20))
    before = _libc.mallinfo2().hblks
    block = _libc.malloc(16 << 20)
    pinned = _libc.mallinfo2().hblks > before
    _libc.free(block)
    return pinned
"""


def _glibc() -> bool:
    import ctypes

    return hasattr(ctypes.CDLL(None), "mallinfo2")


def _run_python(code: str, tmp_path: Path) -> dict:
    r = subprocess.run(
        [sys.executable, "-c", PROBE + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


BUILD = """
from shardcache.ingest.sample import make_sample
files = make_sample("dbn", days=3, seed=1)
"""


@pytest.mark.skipif(not _glibc(), reason="the probe reads glibc's mallinfo2")
def test_build_cache_from_python_leaves_the_allocator_alone(tmp_path):
    got = _run_python(
        BUILD
        + """
from shardcache import build_cache
from shardcache.ingest import tasks
pinned_before = mmap_threshold_pinned()
cache = build_cache(files, "c.zarr", progress=False)
print(json.dumps({"before": pinned_before, "after": mmap_threshold_pinned(), "tuned": tasks._tuned,
                  "bars": cache.n_bars}))
""",
        tmp_path,
    )
    assert got["bars"] > 0 and not got["tuned"]
    assert got["before"] is False and got["after"] is False  # the threshold still follows glibc's own rule


@pytest.mark.skipif(not _glibc(), reason="the probe reads glibc's mallinfo2")
def test_the_cli_pins_the_mmap_threshold_of_its_own_process(tmp_path):
    got = _run_python(
        BUILD
        + """
from shardcache.cli import build_cache_main
from shardcache.ingest import tasks
pinned_before = mmap_threshold_pinned()
code = build_cache_main([*map(str, files), "--out", "c.zarr", "-q"])
print(json.dumps({"before": pinned_before, "after": mmap_threshold_pinned(), "tuned": tasks._tuned, "code": code}))
""",
        tmp_path,
    )
    assert got == {"before": False, "after": True, "tuned": True, "code": 0}


class _FakeLibc:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def mallopt(self, *args: int) -> int:
        self.calls.append(("mallopt", *args))
        return 1

    def malloc_trim(self, pad: int) -> int:
        self.calls.append(("malloc_trim", pad))
        return 1


def test_release_memory_acts_only_after_the_process_opts_in(monkeypatch):
    libc = _FakeLibc()
    monkeypatch.setattr(tasks, "_glibc", lambda: libc)
    monkeypatch.setattr(tasks, "_tuned", False)
    tasks.release_memory()
    assert libc.calls == []  # no trim, no setting, in a process that did not ask
    assert tasks.tune_allocator() is True
    tasks.release_memory()
    assert libc.calls == [("mallopt", -3, 128 << 10), ("malloc_trim", 0)]


def test_tune_allocator_changes_nothing_without_glibc(monkeypatch):
    monkeypatch.setattr(tasks, "_glibc", lambda: None)
    monkeypatch.setattr(tasks, "_tuned", False)
    assert tasks.tune_allocator() is False and tasks._tuned is False
    tasks.release_memory()  # and is a no-op


def test_a_dask_worker_preload_opts_in(monkeypatch):
    libc = _FakeLibc()
    monkeypatch.setattr(tasks, "_glibc", lambda: libc)
    monkeypatch.setattr(tasks, "_tuned", False)
    tasks.dask_setup(worker=None)  # what `dask worker --preload shardcache.ingest.tasks` calls
    assert tasks._tuned and libc.calls == [("mallopt", -3, 128 << 10)]


# ---- a core install: the build extra missing -------------------------------------------------

BLOCK_BUILD_EXTRA = (
    "import sys\n"  # None in sys.modules: `import dask` raises ModuleNotFoundError, as uninstalled
    "for name in ('dask', 'distributed', 'pyarrow', 'databento_dbn'):\n"
    "    sys.modules[name] = None\n"
)


@pytest.mark.parametrize(
    "prog, argv",
    [
        ("build-cache", ["in.dbn", "--out", "c.zarr"]),
        ("shardcache", ["build", "in.dbn", "--out", "c.zarr"]),
        ("shardcache", ["sample", "dbn", "--days", "2"]),
        ("shardcache", ["demo", "--dir", "d"]),
    ],
)
def test_build_commands_without_the_build_extra_say_what_to_install(tmp_path, prog, argv):
    entry = "build_cache_main" if prog == "build-cache" else "main"
    code = BLOCK_BUILD_EXTRA + f"from shardcache.cli import {entry}\nsys.exit({entry}({argv!r}))"
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"{prog}: error: needs the build extra: pip install 'shardcache[build]'"
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_a_missing_module_outside_the_build_extra_is_not_disguised():
    from shardcache import cli

    def broken(args):
        import no_such_module_xyz  # noqa: F401

    with pytest.raises(ModuleNotFoundError):
        cli._run(broken, cli._parser().parse_args(["info", "x"]), "shardcache")


def test_version_comes_from_the_installed_metadata():
    from importlib.metadata import version

    assert shardcache.__version__ == version("shardcache")
    text = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{shardcache.__version__}"' in text  # pyproject is the one copy


def test_dask_workers_preloading_shardcache_tasks_are_tuned():
    """``dask worker --preload shardcache.ingest.tasks``: real worker processes run the hook; the driver does not."""
    distributed = pytest.importorskip("distributed")

    def tuned() -> bool:
        from shardcache.ingest import tasks

        return tasks._tuned

    before = tasks._tuned  # True only if an earlier test ran the CLI in this process
    with (
        distributed.LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            preload=["shardcache.ingest.tasks"],
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        assert list(client.run(tuned).values()) == [_glibc()]
    assert tasks._tuned is before  # the preload tunes the workers, never the driver


def test_make_demo_installs_the_build_extra_only(tmp_path):
    """``make demo`` (a real make, dry run) installs torch and ``.[build]`` into a fresh venv, saying so; a venv
    that ``make test`` already filled is taken as it is; ``make test`` still installs everything."""
    venv = tmp_path / "v"
    dry = subprocess.run(["make", "-n", "demo", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert "installing torch (CPU) and shardcache[build]" in dry.stdout
    assert '-e ".[build]"' in dry.stdout and ".[test]" not in dry.stdout
    full = subprocess.run(["make", "-n", "test", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert '-e ".[test]"' in full.stdout
    venv.mkdir()
    (venv / ".installed").touch()  # everything, newer than pyproject.toml
    real = subprocess.run(
        ["make", "-s", f"{venv}/.installed-demo", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert real.stdout == "" and (venv / ".installed-demo").exists()  # no install, no word
