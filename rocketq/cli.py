"""`rocketq`: one click group over every command family. `broker.cli.main` holds `broker ...`; this
adds `admin ...` and `namesrv ...` without making `broker` import `client`."""

from __future__ import annotations

import click

from admin.cli import admin_group, register_commands
from admin.top import top
from broker.cli import main as broker_main
from namesrv.cli import namesrv_group

main: click.Group = broker_main
register_commands()
main.add_command(admin_group)
main.add_command(top)
main.add_command(namesrv_group)
