"""The typed core of a cache's record: ``Manifest`` (the root attributes, their JSON round trip and
field check) and ``BuildOptions`` (what a cache is built with: checked once, messages naming the
parameter, the command line naming the flag), with ``RunOptions`` kept apart."""

from __future__ import annotations

import copy
import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from helpers.cli import cli

from shardcache import BuildOptions, Manifest, RunOptions, open_cache
from shardcache.errors import CacheError, OptionError, OptionTypeError
from shardcache.format.layout import open_group
from shardcache.ingest.append import append_cache
from shardcache.ingest.builder import build_cache
from shardcache.ingest.sample import make_sample

OPTS = {"split": "train=0.6,val=0.2,test=0.2", "shard_rows": 1024, "chunk_rows": 128, "workers": 1, "progress": False}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> list[Path]:
    return make_sample(tmp_path_factory.mktemp("dbn"), days=4, seed=5)


@pytest.fixture(scope="module")
def built(files, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("built") / "c.zarr"
    build_cache(files[:3], out, **OPTS)
    return out


def _attrs(path: Path) -> dict:
    return dict(open_group(str(path), "r").attrs["shardcache"])


# -- the manifest ------------------------------------------------------------------------------------
def test_a_manifest_round_trips_key_for_key_after_a_build_and_an_append(files, built, tmp_path):
    raw = _attrs(built)
    assert json.dumps(Manifest.from_json(raw).to_json()) == json.dumps(raw)  # same keys, same order, same values
    assert "appends" not in raw  # written only once there was one
    out = tmp_path / "appended.zarr"
    shutil.copytree(built, out)
    appended = append_cache(files[3:], out, progress=False)
    raw = _attrs(out)
    assert raw["appends"] == 1
    assert json.dumps(Manifest.from_json(raw).to_json()) == json.dumps(raw)
    assert appended.manifest == Manifest.from_json(raw) and appended.manifest.appends == 1


def test_the_manifest_holds_the_build_options_it_was_built_with(files, built, tmp_path):
    cache = open_cache(built)
    options = BuildOptions(split=OPTS["split"], shard_rows=1024, chunk_rows=128)
    assert cache.manifest.build.options == options
    assert cache.manifest.build.workers == 1 and cache.manifest.normalize == "zscore"
    again = build_cache(files[:3], tmp_path / "again.zarr", options, run=RunOptions(workers=1, progress=False))
    assert (
        again.manifest.build.options == options and again.manifest.build.fingerprint == cache.manifest.build.fingerprint
    )
    recorded = _attrs(built)["build"]  # the options' fields, beside what they resolved to
    assert BuildOptions.from_json({k: recorded[k] for k in BuildOptions.names() if k in recorded}) == options


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m["layout"].pop("shard_rows"), "the manifest has no layout.shard_rows (it was edited"),
        (lambda m: m.pop("bars_per_symbol"), "the manifest has no bars_per_symbol (it was edited"),
        (lambda m: m["build"].update(max_gap="soon"), "the manifest's build cannot be used (max_gap='soon'"),
    ],
)
def test_an_unreadable_manifest_is_refused_in_one_line_naming_what(built, tmp_path, capsys, edit, message):
    broken = tmp_path / "broken.zarr"
    shutil.copytree(built, broken)
    meta = json.loads((broken / "zarr.json").read_text())
    edit(meta["attributes"]["shardcache"])
    (broken / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(CacheError, match="^" + str(broken).replace(".", r"\.") + ": "):
        open_cache(broken)
    rc, out, err = cli(capsys, "info", str(broken), prog="shardcache")
    assert rc == 2 and out == "" and err.count("\n") == 1 and message in err and "Traceback" not in err


# -- build options -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "options, library, command_line",
    [
        ({"max_gap": "-5m"}, "max_gap='-5m': must be 0 (never cut) or more", "--max-gap '-5m': must be 0"),
        ({"seq_len": 0}, "seq_len=0: must be at least 1", "--seq-len 0: must be at least 1"),
        (
            {"shard_rows": 2048, "chunk_rows": 3000},
            "chunk_rows=3000: must not exceed shard_rows=2048",
            "--chunk-rows 3000: must not exceed --shard-rows 2048",
        ),
        (
            {"split": "val=0.5,test=0.5"},
            (
                "split='val=0.5,test=0.5': z-score statistics come from a split named train, and this layout has "
                "none; name one train, or pass normalize='none'"
            ),
            (
                "--split 'val=0.5,test=0.5': z-score statistics come from a split named train, and this layout has "
                "none; name one train, or pass --normalize none"
            ),
        ),
    ],
)
def test_a_bad_option_names_the_parameter_and_the_command_line_its_flag(
    files, tmp_path, capsys, options, library, command_line
):
    with pytest.raises(OptionError) as err:
        BuildOptions(**options)
    assert str(err.value) == library and err.value.flag().startswith(command_line)
    with pytest.raises(OptionError, match="^" + library.split(":")[0].replace("(", r"\(") + ":"):
        build_cache([tmp_path / "never-read.dbn"], tmp_path / "c.zarr", **options)  # checked before any input
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
    rc, _, err_text = cli(capsys, str(files[0]), "--out", str(tmp_path / "c.zarr"), "-q", *argv)
    assert rc == 2 and err_text.strip().startswith(f"build-cache: error: {command_line}")
    assert not (tmp_path / "c.zarr").exists()


def test_build_options_are_one_frozen_keyword_only_record():
    with pytest.raises(TypeError):
        BuildOptions("zscore")  # keyword-only
    options = BuildOptions(features=["close", "volume"], columns="close, volume", max_gap="1h", split=None)
    assert options.features == ("close", "volume") and options.columns == ("close", "volume")
    assert options.max_gap == "1h" and options.split == "none"  # an int gap is kept as the duration it is
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seq_len = 5  # type: ignore[misc]
    assert options.replace(seq_len=5).seq_len == 5
    with pytest.raises(OptionError, match="^seq_len=-1: "):
        options.replace(seq_len=-1)  # checked again
    assert BuildOptions.from_json(options.to_json()) == options
    assert "stats_from" not in options.to_json() and "workers" not in BuildOptions.names()


def test_the_command_line_takes_its_build_defaults_from_build_options(monkeypatch):
    from shardcache import cli as cli_module

    argv = ["build", "in.dbn", "--out", "c.zarr"]
    assert cli_module._options(cli_module._parser().parse_args(argv))[0] == BuildOptions()
    for name, other in (("codec", "zstd"), ("split", "train=0.5,val=0.5"), ("seq_len", 30), ("max_gap", "5m")):
        field = copy.copy(BuildOptions.__dataclass_fields__[name])
        field.default = other  # another default in BuildOptions: the command line follows it
        monkeypatch.setitem(BuildOptions.__dataclass_fields__, name, field)
    args = cli_module._parser().parse_args(argv)
    assert (args.codec, args.split, args.seq_len, args.max_gap) == ("zstd", "train=0.5,val=0.5", 30, "5m")


def test_run_settings_stay_apart_from_build_options(files, built, tmp_path):
    with pytest.raises(OptionError, match="^workers=0: must be at least 1$"):
        RunOptions(workers=0)
    with pytest.raises(OptionTypeError, match="unexpected keyword argument 'normalise'"):
        build_cache(files, tmp_path / "c.zarr", normalise="none")
    with pytest.raises(OptionTypeError, match="not both"):
        build_cache(files, tmp_path / "c.zarr", BuildOptions(), normalize="none")
    with pytest.raises(OptionError, match="^normalize='none': append_cache keeps the build options of its cache"):
        append_cache(files[3:], built, normalize="none")
    assert not (tmp_path / "c.zarr").exists()


def test_a_max_gap_is_recorded_so_a_recompute_can_rebuild_with_it(files, tmp_path):
    out = tmp_path / "c.zarr"
    first = build_cache(files[:3], out, **{**OPTS, "max_gap": "30m"})
    assert first.manifest.build.options.max_gap == "30m" and first.manifest.build.max_gap_ns == 30 * 60 * 10**9
    rebuilt = append_cache(files[3:], out, stats="recompute", progress=False)
    assert rebuilt.manifest.build.options == first.manifest.build.options.replace(
        split_cuts_ns=first.manifest.splits.cuts_ns
    )
    assert rebuilt.manifest.build.max_gap_ns == 30 * 60 * 10**9
