"""The CLI's help (shardcache/cli.py) as a user reads it: plain text, and every option and argument of
every command explained; checked on the parser and on the installed console scripts' real output."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from shardcache.cli import _add_build_args, _parser

BIN = Path(sys.executable).parent
MARKUP = re.compile(r"``|:(func|class|meth|mod|attr):|^\.\. |`[^`]+`_", re.MULTILINE)


def _commands() -> dict[str, argparse.ArgumentParser]:
    top = _parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    build = argparse.ArgumentParser(prog="build-cache")
    _add_build_args(build)
    return {"shardcache": top, **{f"shardcache {k}": p for k, p in sub.choices.items()}, "build-cache": build}


@pytest.mark.parametrize("name", list(_commands()))
def test_every_option_has_plain_help(name):
    parser = _commands()[name]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help and action.help.strip(), f"{name}: {action.option_strings or action.dest} has no help"
        assert not MARKUP.search(action.help), f"{name}: {action.dest}: markup in {action.help!r}"
    assert not MARKUP.search(parser.description or ""), f"{name}: markup in {parser.description!r}"


@pytest.mark.parametrize(
    "argv",
    [["shardcache", "--help"], ["build-cache", "--help"], *(["shardcache", c, "--help"] for c in ("demo", "info"))],
)
def test_installed_help_is_plain_text(argv):
    exe = BIN / argv[0]
    if not exe.exists():
        pytest.skip(f"{exe} is not installed")
    r = subprocess.run([str(exe), *argv[1:]], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and r.stdout.startswith("usage: ") and not r.stderr
    assert not MARKUP.search(r.stdout), r.stdout
