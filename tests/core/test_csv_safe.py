"""CSV exports never hand a spreadsheet a formula (issue 60, finding 10):
text a tenant controls, such as an API key's name, that begins with = + -
@ or a tab is written led by a quote; numbers stay numbers. Attacked
through the audit trail's CSV export by a user whose name is a formula."""

from __future__ import annotations

import csv
import io

import pytest

from core.csv_stream import csv_lines, csv_text_safe


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ('=HYPERLINK("http://x","y")', '\'=HYPERLINK("http://x","y")'),
        ("@SUM(A1:A9)", "'@SUM(A1:A9)"),
        ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
        ("-2+3", "'-2+3"),
        ("\t=1", "'\t=1"),
        ("-1.50", "-1.50"),  # a number: as it is
        ("+3", "+3"),
        ("plain text", "plain text"),
        ("-inf", "'-inf"),
    ],
)
def test_a_formula_is_written_as_text_and_a_number_as_a_number(text, written):
    assert csv_text_safe(text) == written


def test_an_actor_named_as_a_formula_is_exported_as_text(client, world_a):
    """A username may hold + - @ ("+1+1" is one): the trail names it as the
    actor of what it did, in a cell of its own in the CSV export."""
    from tenants.choices import Role
    from tests.factories import make_member

    sly = make_member(world_a.tenant, Role.OWNER, username="+1+1").user
    client.force_login(sly)
    assert client.post("/keys/", {"name": "ci", "scopes": ["inference"]}).status_code == 303
    text = b"".join(client.get("/api/v1/audit/export").streaming_content).decode()
    actors = [row["actor"] for row in csv.DictReader(io.StringIO(text))]
    assert "'+1+1" in actors and "+1+1" not in actors
    assert list(csv_lines([{"n": "=1", "m": -2}], ["n", "m"]))[1] == "'=1,-2\r\n"
