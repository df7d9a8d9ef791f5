"""Money is Decimal or integer nano-units (DESIGN.md's first invariant): in
the apps that hold money, billing and metering, a float appears only where
it is marked `# ok-float` with what it is (seconds, a share used as a
weight, a percentage shown), so a float cannot slip into an amount unseen.
Elsewhere (the gateway's clocks, planning's forecasts) floats are the
norm and need no mark."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MONEY_APPS = ("billing", "metering")
MARK = "ok-float"


def _spans(tree: ast.AST):
    """(statement, first line, last line) of every statement: a compound
    statement's own lines only (up to its body)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt):
            body = getattr(node, "body", None)
            last = body[0].lineno - 1 if body and isinstance(body, list) else node.end_lineno
            first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
            yield first, max(first, last)


def unmarked_floats(path: Path, *, root: Path = ROOT) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    spans = sorted(_spans(tree), key=lambda s: s[1] - s[0])  # innermost first
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Name) and node.id == "float"):
            continue
        span = next(((a, b) for a, b in spans if a <= node.lineno <= b), (node.lineno,) * 2)
        if not any(MARK in lines[n - 1] for n in range(span[0], span[1] + 1)):
            where = f"{path.relative_to(root)}:{node.lineno}"
            found.append(f"{where}: {lines[node.lineno - 1].strip()}")
    return found


def test_every_float_in_the_money_apps_says_what_it_is():
    found = []
    for app in MONEY_APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" not in path.parts:
                found += unmarked_floats(path)
    assert not found, "floats without `# ok-float: what it is`:\n" + "\n".join(found)


def test_the_check_finds_an_unmarked_float(tmp_path):
    money = tmp_path / "fee.py"
    money.write_text(
        "def fee(amount: float) -> float:\n"
        "    return amount * 1.2\n"
        "\n"
        "def seconds(t: float) -> float:  # ok-float: a clock\n"
        "    return float(\n"
        "        t\n"
        "    )  # ok-float: a clock\n"
    )
    assert unmarked_floats(money, root=tmp_path) == [
        "fee.py:1: def fee(amount: float) -> float:",
        "fee.py:1: def fee(amount: float) -> float:",
    ]
