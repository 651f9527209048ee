"""`rocketq admin user create|update|delete|get|list` (mqadmin `createUser`, `updateUser`,
`deleteUser`, `getUser`, `listUser`): the users of brokers and name servers (issue #37).

A password is read from `--password` or, without it, asked for twice on the terminal (never
echoed); the admin client derives the signing key from it (`protocol.signing.signing_key`) and
sends only that: the password is never sent, printed or logged. Targets (`-b`, `-c`, `--namesrv`)
as `admin.auth_targets`; calling these needs a Super user (`--access-key`) when authentication is on."""

from __future__ import annotations

import click

from admin import auth_targets as targets
from admin.base import admin_group, example_epilog
from auth.model import USER_TYPES, AuthModelError, check_username
from client.admin_api import AdminAPI
from protocol.bodies import UserInfo

STATUSES = ("enable", "disable")


def _username(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return check_username(value)
    except AuthModelError as exc:
        raise click.BadParameter(str(exc)) from None


_USERNAME = click.option("--username", "-u", required=True, callback=_username, metavar="NAME",
                         help="The user's name (its access key): 1-255 of letters, digits and %|_.-.")
_USER_TYPE = click.Choice(USER_TYPES)


@click.group("user")
def user_group() -> None:
    """Users of brokers and name servers: create, update, delete, get, list (authentication)."""



@user_group.command("create", epilog=example_epilog(
    "rocketq admin user create --username billing --password s3cret --user-type Normal --cluster DefaultCluster"))
@_USERNAME
@click.option("--password", "-p", prompt=True, hide_input=True, confirmation_prompt=True,
              help="The password (the user's secret key); asked for when not given (safer: a command line "
                   "is visible to the host's other users).")
@click.option("--user-type", "-t", type=_USER_TYPE, default="Normal", show_default=True,
              help="Super: may do everything; Normal: what its ACL allows.")
@targets.target_command
def create(username: str, password: str, user_type: str, brokers: tuple[str, ...], cluster: str | None,
           namesrv: bool, endpoints: str, as_json: bool) -> None:
    """Create a user (refused where it exists) on each target; only its derived key is sent."""
    outcomes = targets.run_on_targets(endpoints, targets.Selection(brokers, cluster, namesrv),
                              lambda api, address: api.create_user(address, username, password, user_type))
    targets.report_changes(outcomes, f"created {user_type} user {username}", as_json)


@user_group.command("update", epilog=example_epilog(
    "rocketq admin user update --username billing --user-status disable --cluster DefaultCluster"))
@_USERNAME
@click.option("--password", "-p", default=None, help="A new password (only its derived key is sent).")
@click.option("--user-type", "-t", type=_USER_TYPE, default=None, help="A new type: Super or Normal.")
@click.option("--user-status", "-s", type=click.Choice(STATUSES), default=None,
              help="disable: the user's requests are refused until enabled again.")
@targets.target_command
def update(username: str, password: str | None, user_type: str | None, user_status: str | None,
           brokers: tuple[str, ...], cluster: str | None, namesrv: bool, endpoints: str, as_json: bool) -> None:
    """Change a user's password, type or status on each target; what is not given is kept."""
    if password is None and user_type is None and user_status is None:
        raise click.UsageError("give --password, --user-type or --user-status")
    outcomes = targets.run_on_targets(endpoints, targets.Selection(brokers, cluster, namesrv),
                              lambda api, address: api.update_user(address, username, password, user_type,
                                                                   user_status))
    targets.report_changes(outcomes, f"updated user {username}", as_json)


@user_group.command("delete", epilog=example_epilog("rocketq admin user delete --username billing --cluster "
                                                    "DefaultCluster"))
@_USERNAME
@targets.target_command
def delete(username: str, brokers: tuple[str, ...], cluster: str | None, namesrv: bool, endpoints: str,
           as_json: bool) -> None:
    """Delete a user, and its ACL, on each target."""
    outcomes = targets.run_on_targets(endpoints, targets.Selection(brokers, cluster, namesrv),
                              lambda api, address: api.delete_user(address, username))
    targets.report_changes(outcomes, f"deleted user {username}", as_json)


def _show(outcomes: list[targets.Outcome[list[UserInfo]]], as_json: bool, title: str) -> None:
    rows = [{"at": o.target.label, "username": user.username, "user_type": user.user_type,
             "user_status": user.user_status} for o in outcomes for user in o.value or ()]
    targets.show_rows(outcomes, rows, ["username", "user_type", "user_status"], as_json, title)


targets.get_command(user_group, "rocketq admin user get --username billing -b 127.0.0.1:10911", _USERNAME,
            "Show a user's type and status on each target (never its key).", AdminAPI.get_user, _show, "user {}")


@user_group.command("list", epilog=example_epilog("rocketq admin user list --filter bill --cluster DefaultCluster"))
@click.option("--filter", "-f", "name_filter", default="", help="Only users whose name contains this.")
@targets.target_command
def list_users(name_filter: str, brokers: tuple[str, ...], cluster: str | None, namesrv: bool, endpoints: str,
               as_json: bool) -> None:
    """List the users of each target, by name."""
    outcomes = targets.run_on_targets(endpoints, targets.Selection(brokers, cluster, namesrv),
                              lambda api, address: api.list_users(address, name_filter))
    _show(outcomes, as_json, "users")


admin_group.add_command(user_group)
admin_group.aliases.update({
    "createUser": ["user", "create"], "updateUser": ["user", "update"], "deleteUser": ["user", "delete"],
    "getUser": ["user", "get"], "listUser": ["user", "list"],
})
