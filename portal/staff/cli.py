"""``flask --app app portal create-staff EMAIL --role ...``."""

from __future__ import annotations

import sys

import click
from flask import current_app
from flask.cli import AppGroup, with_appcontext

from portal.db import db
from portal.seams import current_portal
from portal.staff.audit import command_line_actor
from portal.staff.models import Role
from portal.staff.passwords import Passwords, password_problem
from portal.staff.services import StaffError, create_staff


def _password_from_stdin() -> str:
    # One line: the newline ends it and is not part of the password.
    line = sys.stdin.readline()
    return line.removesuffix("\n").removesuffix("\r")


def _password_from_prompt() -> str:
    while True:
        password = click.prompt(
            "Password", hide_input=True, confirmation_prompt="Repeat the password"
        )
        problem = password_problem(password)
        if problem is None:
            return password
        click.echo(problem, err=True)


@click.command("create-staff")
@click.argument("email")
@click.option(
    "--role",
    "roles",
    multiple=True,
    required=True,
    type=click.Choice([r.value for r in Role]),
    help="A role to grant; repeat for several.",
)
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from the first line of standard input instead of a prompt.",
)
@with_appcontext
def create_staff_command(email: str, roles: tuple[str, ...], password_stdin: bool) -> None:
    """Create a staff user with the given roles; they replace the password at first sign-in."""
    password = _password_from_stdin() if password_stdin else _password_from_prompt()
    passwords: Passwords = current_portal(current_app).passwords
    try:
        with db.begin() as session:
            user = create_staff(
                session,
                email=email,
                password=password,
                roles=[Role(r) for r in roles],
                actor=command_line_actor(),
                passwords=passwords,
                now=current_portal().clock.now(),
                # Whoever typed it is not the person: they choose their own at first sign-in.
                must_replace_password=True,
                via="cli",
            )
            created = (user.email, sorted(r.value for r in user.roles))
    except StaffError as error:
        raise click.ClickException(error.message) from None
    click.echo(f"created staff user {created[0]} with roles {', '.join(created[1])}")
    click.echo("they will be asked to choose a new password when they first sign in", err=True)


def register(group: AppGroup) -> None:
    """Add the staff commands to the ``portal`` command group."""
    group.add_command(create_staff_command)
