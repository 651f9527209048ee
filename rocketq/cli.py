"""`rocketq`: one click group over every command family. `broker.cli.main` holds `broker ...`; this
adds `admin ...`, `namesrv ...`, `console ...` and `controller ...` without making `broker` import
`client`, and `--version`."""

from __future__ import annotations

import click

from admin.cli import admin_group, register_commands, version_option
from admin.top import top
from broker.cli import main as broker_main
from console.cli import console_group
from controller.cli import controller_group
from namesrv.cli import namesrv_group

main: click.Group = version_option(broker_main)
register_commands()
main.add_command(admin_group)
main.add_command(top)
main.add_command(namesrv_group)
main.add_command(console_group)
main.add_command(controller_group)
