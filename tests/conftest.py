"""Shared pytest fixtures. Each section belongs to one part of the project; add new sections below."""

from __future__ import annotations

import pytest
from helpers import Bars, make_cache, synthetic_bars

# ---- the two tiers: `pytest -m "not slow"` (make test-fast) and everything (make test, CI) ----
# A test is slow when it spawns DDP ranks, runs a notebook kernel, measures memory in subprocesses,
# loops SIGKILLs or needs the S3 server: each costs seconds, and together they were 2/3 of the suite.
SLOW_FIXTURES = {
    "s3_endpoint": "a moto S3 server",
    "this_python_kernel": "a notebook kernel",
}
SLOW_TESTS = {  # file -> test function -> why
    "test_train_loop.py": {
        "test_two_steps_of_every_scenario_give_one_table_row_each": "six training processes and DataLoader workers",
    },
    "test_scaling.py": {"test_ddp_ranks_cover_the_epoch_once": "DDP ranks spawned"},
    "test_folds.py": {"test_gloo_ranks_serve_a_folds_train_windows_once": "DDP ranks spawned"},
    "test_normalize.py": {"test_gloo_ranks_serve_z_scored_windows_once": "DDP ranks spawned"},
    "test_memory.py": {
        "test_worker_tree_memory_does_not_grow_with_bars": "memory of a process tree",
        "test_ten_trials_in_one_process_leave_nothing_behind": "memory in a subprocess",
        "test_window_dataset_random_access_is_bounded_by_its_lru": "memory in a subprocess",
    },
    "test_stream_workers.py": {
        "test_streaming_rss_does_not_grow_with_bars": "memory in a subprocess",
        "test_loader_lifecycles_leave_nothing_behind": "eleven DataLoader worker lifecycles and their RSS",
        "test_spawned_workers_share_the_position": "spawned workers, each importing torch afresh",
        "test_a_late_worker_starts_at_the_first_batch_of_the_pass": "worker processes held back on purpose",
        "test_resume_in_a_new_process": "a second Python process with DataLoader workers",
    },
    "test_profile_memory.py": {
        "test_single_command_peak_plot_and_json": "memory of a subprocess",
        "test_tree_sums_children": "memory of a process tree",
        "test_compare_two_commands": "memory of two subprocesses",
        "test_plot_one_series_per_command": "memory of two subprocesses",
    },
    "test_reliability.py": {
        "test_readers_see_only_complete_caches_during_build_and_overwrite": "builds while a reader polls",
        "test_sigkill_anywhere_then_resume_gives_the_same_cache": "a SIGKILL loop",
        "test_sigkill_during_overwrite_leaves_the_old_or_the_new_cache": "a SIGKILL loop",
        "test_sigkill_inside_a_batch_then_resume_gives_the_same_cache": "a SIGKILL loop",
    },
    "test_append.py": {
        "test_sigkilled_append_leaves_the_cache_as_it_was_and_resumes": "a SIGKILL loop",
        "test_append_killed_at_random_points_never_changes_a_file_of_the_cache": "a SIGKILL loop over a CLI process",
    },
    "test_append_truth.py": {
        "test_a_killed_object_store_append_run_again_records_its_inputs_once": "a SIGKILL loop on an S3 server",
    },
    "test_staging.py": {  # the local variant of the same lock stays in the fast tier
        "test_a_second_build_of_an_object_store_output_is_refused_while_the_first_runs": "a build in a subprocess",
    },
    "test_install.py": {"test_dask_workers_preloading_shardcache_tasks_are_tuned": "a dask cluster of its own"},
    "test_typing.py": {  # seconds once .mypy_cache/users-of-the-wheel holds torch's and numpy's stubs
        "test_a_user_of_the_installed_wheel_gets_shardcache_types": "a wheel build, then mypy (a minute cold)",
    },
    "test_read_options.py": {"test_a_pinned_process_streams_with_one_decoder": "a pinned Python process"},
    "test_docs.py": {  # the fast tier checks every page's blocks and markers without running them
        "test_blocks_run_as_written": "every block of a page: builds, trainings, servers and a DDP job",
        "test_readme_figures_are_a_run_of_the_full_sample": "shardcache demo on the 360-day sample",
        "test_the_docs_gate_fails_on_a_broken_anchor": "two strict builds of the site",
    },
    "test_append_during_reads.py": {
        "test_opening_a_cache_500_times_while_appends_run_never_sees_a_mixed_state": "an append loop in a subprocess",
    },
    "test_build.py": {  # test_sources_dbn reads every shared file in the fast tier
        "test_every_shared_dbn_file_builds_or_is_refused_cleanly": "a build per shared DBN file",
        "test_default_sample_every_row_and_timestamp": "the full 360-day sample, decoded twice",
    },
    "test_sample.py": {
        "test_default_sample_size": "the full 360-day sample",
        "test_demo_days_always_gives_that_many_days": "three demo processes: generate, build, stream",
    },
    "test_notebook.py": {  # also slow by their fixture (this_python_kernel); named so a rename is caught
        "test_notebook_runs_and_draws_its_figures": "a notebook kernel",
        "test_notebook_builds_a_small_cache_when_there_is_none": "a notebook kernel",
        "test_jupyter_nbconvert_runs_it_from_another_folder_and_leaves_nothing_behind": "a notebook kernel",
    },
    "test_stream_ddp.py": {"test_ranks_are_disjoint_and_cover_the_epoch": "DDP ranks spawned"},
    "test_stream_mix.py": {
        "test_gloo_ranks_serve_the_mix_once_and_resume_at_another_world_size": "gloo ranks spawned twice",
    },
    "test_stream_lightning.py": {
        "test_readme_lightning_recipe_with_limit_train_batches_and_sanity_check": "Lightning trainers and workers",
        "test_mixing_lightning_recipe_validates_both_caches_and_checkpoints_a_resumable_mix": "Lightning trainers",
    },
}


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tier; a name in SLOW_TESTS that its test file no longer defines is an error,
    so a renamed test cannot drop into the fast tier unnoticed, and so is a ``slow`` mark set in a test
    file: this is the one place that says what is slow."""
    modules = {}
    for item in items:
        file, name = item.path.name, getattr(item, "originalname", item.name)
        modules.setdefault(file, item.module)
        if item.get_closest_marker("slow"):
            raise pytest.UsageError(
                f"{file}::{name} is marked slow in its file; declare it in tests/conftest.py SLOW_TESTS"
            )
        why = SLOW_TESTS.get(file, {}).get(name) or next(
            (w for f, w in SLOW_FIXTURES.items() if f in getattr(item, "fixturenames", ())), None
        )
        if why:
            item.add_marker(pytest.mark.slow(reason=why))
    stale = [
        f"{file}::{name}"
        for file, module in modules.items()
        for name in SLOW_TESTS.get(file, {})
        if not hasattr(module, name)
    ]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW_TESTS names tests that do not exist: {', '.join(stale)}")


# ---- window plan and stream (shardcache/read/plan.py, shardcache/read/stream.py) ----------


@pytest.fixture(scope="session")
def stream_bars() -> Bars:
    """6000 bars, 5 features, 3 symbols with gaps, tiny segments and train/val/test splits."""
    return synthetic_bars(6000, 5, n_symbols=3, seed=7, shard_rows=512)


@pytest.fixture(scope="session")
def stream_cache(tmp_path_factory, stream_bars):
    """``stream_bars`` written with 512-row shards (12 shards, several pools per epoch)."""
    path = tmp_path_factory.mktemp("stream") / "bars.zarr"
    return make_cache(path, stream_bars, shard_rows=512, chunk_rows=128)


# ---- object storage: a real S3-compatible server on 127.0.0.1 (tests/test_scaling.py) ------


@pytest.fixture(scope="session")
def twenty_days(tmp_path_factory):
    """Twenty weekdays of ES and NQ minutes (sessions, weekends and missing minutes as the sample has them):
    the DBN files walk-forward folds and read-time cuts are tried on."""
    from shardcache.ingest.sample import make_sample

    return make_sample(tmp_path_factory.mktemp("twenty"), days=20, symbols=["ESH3", "NQH3"], seed=4)


@pytest.fixture(scope="session")
def twenty_day_cache(tmp_path_factory, twenty_days):
    """``make(name, **build options)``: the twenty days built into a new cache (small shards, one worker); its path."""
    from shardcache import build_cache

    def make(name: str, **options) -> str:
        out = tmp_path_factory.mktemp(name) / f"{name}.zarr"
        build_cache(twenty_days, out, shard_rows=1024, chunk_rows=128, workers=1, progress=False, **options)
        return str(out)

    return make


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server in server mode on 127.0.0.1 (a free port) for the session: its endpoint URL.

    The AWS variables point every client at fake credentials (also in subprocesses, DDP ranks
    and dask workers started by a test); no request leaves the machine.
    """
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("s3fs")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            mp.setenv(key, value)
        for key in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            mp.delenv(key, raising=False)
        server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint):
    """A new empty bucket on the session's S3 server: ``("s3://NAME", storage_options)``."""
    import uuid

    import s3fs

    options = {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}
    name = f"shardcache-{uuid.uuid4().hex[:12]}"
    s3fs.S3FileSystem(**options).mkdir(name)
    return f"s3://{name}", options


# ---- counting reads (shardcache/format/cache.py) ----------------------------------------------
@pytest.fixture
def reads(monkeypatch):
    """Every block a ``Cache`` reads (``read_rows`` or ``read_many``), as ``(start, stop)``."""
    from helpers.stream import spy_block_reads

    calls = []
    spy_block_reads(monkeypatch, lambda cache, start, stop: calls.append((start, stop)))
    return calls
