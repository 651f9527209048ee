"""The `rocketq admin` click group (`admin_group`) that every command family adds itself to.

The group lives here, below every command module: a family (`admin/topic.py`, `admin/dlq.py`, ...)
imports `admin_group` from this module and decorates its commands onto it, and `admin.cli` imports
the families to assemble the command line, so nothing imports back up. Command names are
kebab-case; RocketMQ's camelCase mqadmin names are accepted as aliases through
`AliasedGroup.aliases` (e.g. `consumerProgress` -> `consumer progress`)."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any, TypeVar

import click

from admin.common import endpoints_option

CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"], "max_content_width": 100}
_F = TypeVar("_F", bound=Callable[..., Any])


def _print_version(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"{ctx.find_root().info_name} {importlib.metadata.version('rocketq')}")
        ctx.exit()


def version_option(command: _F) -> _F:
    """`--version`: prints the program's name and the installed rocketq package's version
    (`rocketq 0.1.0`, `mqadmin 0.1.0`), then exits."""
    return click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
                        help="Print the rocketq version and exit.")(command)


def example_epilog(command_line: str) -> str:
    """A command's help epilog: `Example:` and one command line, printed as written (click's `\\b`)."""
    return f"\b\nExample:\n  {command_line}"


class AliasedGroup(click.Group):
    """A click group that also resolves aliases: `aliases` maps an alias (e.g. RocketMQ's camelCase
    `consumerProgress`) to the argument list it stands for (`["consumer", "progress"]`)."""

    aliases: dict[str, list[str]] = {}

    def resolve_command(self, ctx: click.Context,
                        args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        if args and args[0] in self.aliases:
            args = [*self.aliases[args[0]], *args[1:]]
        return super().resolve_command(ctx, args)


@click.group("admin", cls=AliasedGroup, context_settings=CONTEXT_SETTINGS)
@version_option
@endpoints_option
def admin_group(endpoints: str) -> None:
    """Administer brokers over the wire protocol: topics, groups, offsets, messages, dead letters,
    users and ACLs. --endpoints/-n, --access-key and --secret-key here are the defaults of every
    subcommand (mqadmin topicList -n 127.0.0.1:9876 and mqadmin -n 127.0.0.1:9876 topicList are
    the same)."""
