"""One cache is one cache, mixes refuse what is almost always a mistake, and shared documents are
named as such (issue 30): real caches under other names (a symlink, a ``file://`` URL, relative and
absolute paths, a ``cp -r`` copy), z-scored with raw, weights of every kind, and a hard-linked
``zarr.json`` edited in place, checked through ``shardcache verify`` and xarray."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xarray as xr
from helpers.parquet import build_raw, make_bars, write_parquet
from helpers.stream import keys_of

from shardcache import build_cache
from shardcache.cli import main
from shardcache.errors import OptionError, OptionTypeError
from shardcache.format.cache import Cache
from shardcache.ingest.sample import make_sample
from shardcache.inspect.verify import verify_cache
from shardcache.read.dataset import WindowDataset
from shardcache.read.mixture import Mixture
from shardcache.read.stream import WindowStream

DATES = "val=2023-01-04"
BUILD = {"shard_rows": 1024, "chunk_rows": 128, "workers": 1, "progress": False, "split": DATES}
KW = {"split": "train", "batch_size": 64, "meta": True}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Any]:
    """ES and NQ built apart (z-scored), NQ raw (``normalize='none'``) and their inputs (``dbn``)."""
    root = tmp_path_factory.mktemp("one")
    dbn = {s: make_sample(root / s, days=4, symbols=[s], seed=2) for s in ("ESH3", "NQH3")}
    return {
        "es": build_cache(dbn["ESH3"], root / "es.zarr", **BUILD),
        "nq": build_cache(dbn["NQH3"], root / "nq.zarr", **BUILD),
        "raw": build_cache(dbn["NQH3"], root / "raw.zarr", normalize="none", **BUILD),
        "dbn": dbn,
    }


def refusal(caches, make=WindowStream) -> str:
    with pytest.raises(OptionError) as info:
        make(caches, 60, **(KW if make is WindowStream else {"split": "train"}))
    text = str(info.value)
    assert "\n" not in text and text.startswith("caches=")
    return text


def test_the_same_cache_under_another_name_or_as_a_copy_is_refused_naming_both(built, tmp_path, monkeypatch):
    es = Path(built["es"].url)
    link = tmp_path / "link_to_es.zarr"
    link.symlink_to(es, target_is_directory=True)
    copy = tmp_path / "copy_of_es.zarr"
    subprocess.run(["cp", "-r", str(es), str(copy)], check=True)
    monkeypatch.chdir(es.parent)
    names = {
        "a symlink": str(link),
        "a file:// URL": "file://" + os.path.abspath(es),
        "a relative path": os.path.join(".", es.name),
        "a trailing slash": str(es) + "/",
        "a cp -r copy": str(copy),
    }
    for what, other in names.items():
        for make in (WindowStream, WindowDataset):
            text = refusal([str(es), other], make)
            assert f"caches[1] {other} is caches[0] {es} again (" in text, (what, text)
            assert "the stream would serve each of its windows twice; give each cache once" in text
        assert "another name for it, or a copy: the same manifest" in refusal([built["nq"], str(es), other])
    assert "(given twice)" in refusal([built["es"], str(es)])
    stream = WindowStream([built["es"], built["nq"]], 60, **KW)  # two caches are still two
    assert set(keys_of(stream)[:, 0].tolist()) == {0, 1}


def test_a_rebuild_of_the_same_inputs_is_another_cache_and_a_copy_the_same(built, tmp_path):
    es = Path(built["es"].url)
    again = build_cache(built["dbn"]["ESH3"], tmp_path / "again.zarr", **BUILD)  # the same inputs, another build
    assert again.manifest.identity != built["es"].manifest.identity
    copy = Cache(shutil.copytree(es, tmp_path / "copy.zarr"))
    assert copy.manifest.identity == built["es"].manifest.identity  # a copy is the same cache
    assert len(WindowStream([built["es"], again], 60, **KW).caches) == 2


def test_a_z_scored_cache_mixed_with_a_raw_one_is_refused(built):
    es, raw = built["es"].url, built["raw"].url
    for make in (WindowStream, WindowDataset):
        text = refusal([es, raw], make)
        assert (
            f"{es} is z-scored (normalize='zscore') but {raw} is raw (normalize='none'): the model would see each "
            "feature on two scales; build every cache with the same build-cache --normalize" in text
        )
    assert f"{es} is z-scored" in refusal([raw, es])  # either order


def test_bool_weights_are_refused_and_every_sequence_of_numbers_is_taken_alike(built):
    for bools in [(True, False), np.array([True, False]), torch.tensor([True, False]), [np.True_, 1.0]]:
        with pytest.raises(OptionError, match="True and False are not weights: give one number per cache"):
            WindowStream([built["es"], built["nq"]], 60, weights=bools, **KW)
    want = Mixture.of(weights=(3, 1), epoch_windows=None, n_sources=2)
    for given in [[3, 1], np.array([3.0, 1.0]), np.array([3, 1], np.int32), torch.tensor([3.0, 1.0]), (3.0, 1)]:
        assert Mixture.of(weights=given, epoch_windows=None, n_sources=2) == want, given
    for scalar in [torch.tensor(1.0), np.float64(1.0), 1.0]:
        with pytest.raises(OptionTypeError, match="give one number per cache"):
            Mixture.of(weights=scalar, epoch_windows=None, n_sources=2)
    kw = {**KW, "epoch_windows": 500, "seed": 3}
    by_tuple = keys_of(WindowStream([built["es"], built["nq"]], 60, weights=(3, 1), **kw))
    by_tensor = keys_of(WindowStream([built["es"], built["nq"]], 60, weights=torch.tensor([3, 1]), **kw))
    assert len(by_tuple) == 500 and np.array_equal(by_tensor, by_tuple)


@pytest.fixture
def linked(tmp_path) -> Path:
    """A raw cache of three symbols of one length (their documents are hard links to one file each) and one other."""
    bars = make_bars({"AA": 1500, "BB": 1500, "CC": 1500, "DD": 900})
    build_raw(write_parquet(tmp_path / "bars.parquet", bars), tmp_path / "c.zarr", shard_rows=512, chunk_rows=128)
    return tmp_path / "c.zarr"


def test_verify_names_an_edited_hard_linked_document_as_one_file_and_its_symbols(linked, capsys):
    doc = linked / "symbols" / "0" / "features" / "zarr.json"
    assert doc.stat().st_nlink == 3 and doc.samefile(linked / "symbols" / "2" / "features" / "zarr.json")
    meta = json.loads(doc.read_text())
    meta["shape"][0] = 1400
    with open(doc, "r+") as fh:  # an editor writing the file in place, as `vim` and `open(..., "w")` do
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(meta))
    with pytest.raises(ValueError, match="conflicting sizes for dimension 'time'"):  # an untouched symbol
        xr.open_zarr(linked, group="symbols/1", consolidated=False)
    code = main(["verify", str(linked)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1 and len(lines) == 2, lines
    assert lines[0] == (
        "symbols/0/features/zarr.json: one file, hard-linked as the features document of 3 symbols (AA, BB, CC): "
        "shape (1400, 3), manifest says (1500, 3); it was changed in place, which changes every symbol sharing it: "
        "rebuild the cache (build-cache --overwrite); to edit one symbol's document, copy it apart first "
        "(cp zarr.json zarr.json.new && mv zarr.json.new zarr.json)"
    )
    assert lines[1].startswith(f"{linked}: 1 problem(s), 0 bad shard(s)")
    (problem,) = verify_cache(linked).problems
    assert problem.shared == tuple(f"symbols/{i}/features/zarr.json" for i in range(3))


def test_a_document_copied_apart_before_editing_changes_its_symbol_alone(linked, capsys):
    doc = linked / "symbols" / "1" / "zarr.json"  # every symbol's group document: one file
    assert doc.stat().st_nlink == 4
    shutil.copy(doc, f"{doc}.new")
    os.replace(f"{doc}.new", doc)  # the link broken: cp then mv
    meta = json.loads(doc.read_text())
    meta["attributes"] = {"note": "edited"}
    doc.write_text(json.dumps(meta))
    assert (linked / "symbols" / "0" / "zarr.json").stat().st_nlink == 3
    assert xr.open_zarr(linked, group="symbols/1", consolidated=False).sizes["time"] == 1500  # zarr reads it
    code = main(["verify", str(linked)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1 and lines[0] == (
        "symbols/1/zarr.json: differs from the zarr.json build-cache writes for this layout (attributes)"
    ), lines
