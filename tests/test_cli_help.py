"""Every command's `--help` ends with one example that the command accepts, and `--version` prints
the installed package's version (`rocketq --version`, `mqadmin --version`)."""

from __future__ import annotations

import importlib.metadata
import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from admin.cli import admin_group
from broker.cli import mqbroker
from controller.cli import mqcontroller
from namesrv.cli import mqnamesrv
from rocketq.cli import main


def leaves(command: click.Command, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], click.Command]]:
    """(full command path, command) of every command below `command` that is not a group."""
    if not isinstance(command, click.Group):
        return [(path, command)]
    return [leaf for name, sub in sorted(command.commands.items()) for leaf in leaves(sub, (*path, name))]


COMMANDS = [*leaves(main, ("rocketq",)), (("mqbroker",), mqbroker), (("mqnamesrv",), mqnamesrv),
            (("mqcontroller",), mqcontroller)]


def test_the_tree_has_every_command_family() -> None:
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"rocketq broker start", "rocketq namesrv start", "rocketq store check", "rocketq top",
            "rocketq admin topic create", "rocketq admin dlq resend", "mqbroker", "mqnamesrv",
            "rocketq controller start", "mqcontroller"} <= names
    assert len(names) >= 25


@pytest.fixture
def example_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A working directory holding the files and directories the examples name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "store").mkdir()
    (tmp_path / "conf").mkdir()
    for name in ("broker.toml", "namesrv.toml"):
        (tmp_path / "conf" / name).write_text("")


@pytest.mark.usefixtures("example_files")
@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(path) for path, _ in COMMANDS])
def test_every_command_help_ends_with_an_example_it_accepts(path: tuple[str, ...], command: click.Command) -> None:
    result = CliRunner().invoke(main if path[0] == "rocketq" else command, [*path[1:], "--help"])
    assert result.exit_code == 0, result.output
    lines = result.output.rstrip().splitlines()
    assert lines[-2].strip() == "Example:", f"{' '.join(path)} --help does not end with an example"
    example = shlex.split(lines[-1])
    assert tuple(example[:len(path)]) == path, lines[-1]
    with command.make_context(" ".join(path), example[len(path):]) as ctx:   # parses, runs nothing
        assert ctx.params


@pytest.mark.parametrize(("command", "args", "prog"), [(main, ["--version"], "rocketq"),
                                                       (admin_group, ["--version"], "mqadmin"),
                                                       (main, ["admin", "--version"], "rocketq")])
def test_version_prints_the_package_version(command: click.Command, args: list[str], prog: str) -> None:
    result = CliRunner().invoke(command, args, prog_name=prog)
    assert result.exit_code == 0, result.output
    assert result.output == f"{prog} {importlib.metadata.version('rocketq')}\n"
