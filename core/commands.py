"""What the management commands share: an option type for a moment, and a
service's refusal said in one line that names the option, as a
CommandError (exit status 1, no traceback), rather than a ValidationError
or an InputError escaping with its traceback."""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.core.management.base import CommandError

from core.calendar import utc_moment
from core.errors import InputError

MOMENT_EXPECTED = "use ISO 8601 in UTC, e.g. 2026-10-05 or 2026-10-05T14:00"


def moment_option(value: str) -> datetime:
    """utc_moment as an argparse type: a value that is no date or time is
    refused naming the option ("argument --start: '2026-13-01' is not ...")."""
    try:
        return utc_moment(value)
    except (ValueError, OverflowError):  # overflow: year 1 with an offset east of UTC
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a date or time ({MOMENT_EXPECTED})"
        ) from None


def option_name(field: str, options: Mapping[str, str] | None = None) -> str:
    """How the command line spells a service's field: `options` where given
    (a positional argument, a renamed option), else --field-name."""
    if options and field in options:
        return options[field]
    return "--" + field.replace("_", "-")


@contextmanager
def refusals_as_command_errors(
    *, options: Mapping[str, str] | None = None, asked: str = ""
) -> Iterator[None]:
    """A ValidationError or InputError raised inside becomes a CommandError
    of one line: each field's option and its first message ("--end: must be
    after start"), then `asked` (what the command asked for, defaults
    included) when given."""
    try:
        yield
    except InputError as error:
        raise CommandError(_line([(error.field, error.message)], options, asked)) from None
    except ValidationError as error:
        if hasattr(error, "error_dict"):
            problems = [(field, messages[0]) for field, messages in error.message_dict.items()]
        else:
            problems = [(NON_FIELD_ERRORS, error.messages[0])]
        raise CommandError(_line(problems, options, asked)) from None


def _line(problems: list[tuple[str, str]], options: Mapping[str, str] | None, asked: str) -> str:
    said = "; ".join(
        message if field == NON_FIELD_ERRORS else f"{option_name(field, options)}: {message}"
        for field, message in problems
    )
    return f"{said} (asked for {asked})" if asked else said
