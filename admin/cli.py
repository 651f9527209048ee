"""`rocketq admin` / `mqadmin`: the command line assembled. `admin.base` holds the click group;
each command family module adds its commands to it when imported (`register_commands`), and this
module, which nothing below it imports, puts the two together."""

from __future__ import annotations

from admin.base import CONTEXT_SETTINGS, AliasedGroup, admin_group, example_epilog, version_option

__all__ = ["CONTEXT_SETTINGS", "AliasedGroup", "admin_group", "example_epilog", "main", "register_commands",
           "version_option"]


def register_commands() -> None:
    """Import each command family so that it adds itself to `admin_group`. Called once by `main`."""
    import admin.acl
    import admin.broker_status
    import admin.consumer
    import admin.dlq
    import admin.filter
    import admin.group
    import admin.message
    import admin.offset
    import admin.topic
    import admin.trace
    import admin.user  # noqa: F401


def main() -> None:
    """`mqadmin ...`: the same as `rocketq admin ...`."""
    register_commands()
    admin_group(prog_name="mqadmin")
