"""`.env.example` (and the settings table in docs/configuration.md) name every setting the
code reads from the environment, and nothing it no longer reads. The names
come from the code itself, parsed with `ast`: a setting added without its
line in `.env.example` fails here with its name.

A read is `env(NAME)` or `env.<cast>(NAME)` in config/settings/, a call to a
function there that reads the setting its first argument names (production's
`_required`), and `os.environ.get/setdefault(NAME)`, `os.environ[NAME]`,
`NAME in os.environ` or `os.getenv(NAME)` in any of the project's packages.
NAME is a string literal or a module-level string constant. In the settings
modules a read this test cannot name fails it; elsewhere such a read (a
process handing its own children a variable it set: gateway.operator) is
not seen."""

from __future__ import annotations

import ast
import functools
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_DIR = ROOT / "config" / "settings"
ENV_EXAMPLE = ROOT / ".env.example"
CONFIGURATION = ROOT / "docs" / "configuration.md"

# Read from the environment, but not settings an operator gives.
NOT_SETTINGS = {
    # The main job sets it on each server it starts (core.processes), so
    # /healthz proves which process answers on a port.
    "SERVER_INSTANCE",
    # The user's cache folder (XDG base directories), only where VLLM_VENV
    # defaults to; VLLM_VENV is the setting.
    "XDG_CACHE_HOME",
    # `manage.py gateway` names its private socket folder to its own workers
    # (gateway.operator_channel).
    "GATEWAY_OPERATOR_CHANNEL_DIR",
}
_ENVIRON_READS = {"get", "setdefault"}  # pop: a process clearing what it set


def _is_os(node: ast.expr, attr: str) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == attr
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _name_argument(call: ast.Call, *, settings: bool, readers: set[str]) -> ast.expr | None:
    """The expression naming the variable when `call` reads one, else None."""
    func = call.func
    reads = (
        _is_os(func, "getenv")
        or (
            isinstance(func, ast.Attribute)
            and func.attr in _ENVIRON_READS
            and _is_os(func.value, "environ")
        )
        or (isinstance(func, ast.Name) and func.id in readers)
        or (
            settings
            and (
                (isinstance(func, ast.Name) and func.id == "env")
                or (
                    isinstance(func, ast.Attribute)
                    and isinstance(func.value, ast.Name)
                    and func.value.id == "env"
                )
            )
        )
    )
    if not reads:
        return None
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg in {"var", "key"}), None)


def _name_nodes(tree: ast.AST, *, settings: bool, readers: set[str]):
    """(node, function it sits in) for every expression naming a variable read."""

    def walk(node: ast.AST, function: ast.FunctionDef | ast.AsyncFunctionDef | None):
        for child in ast.iter_child_nodes(node):
            inside = (
                child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function
            )
            named = None
            if isinstance(child, ast.Call):
                named = _name_argument(child, settings=settings, readers=readers)
            elif isinstance(child, ast.Subscript) and isinstance(child.ctx, ast.Load):
                named = child.slice if _is_os(child.value, "environ") else None
            elif isinstance(child, ast.Compare) and isinstance(child.ops[0], ast.In | ast.NotIn):
                named = child.left if _is_os(child.comparators[0], "environ") else None
            if named is not None:
                yield named, function
            yield from walk(child, inside)

    yield from walk(tree, None)


def _first_parameter(function: ast.FunctionDef | ast.AsyncFunctionDef | None) -> str | None:
    parameters = (function.args.posonlyargs + function.args.args) if function else []
    return parameters[0].arg if parameters else None


def environment_reads(source: str, *, path: str, settings: bool) -> tuple[set[str], list[str]]:
    """The variable names `source` reads, and where it reads one it does not name."""
    tree = ast.parse(source, filename=path)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    # Functions that read the variable their first argument names: calls to
    # them are reads too (repeated until no new one is found).
    readers: set[str] = set()
    while True:
        found = {
            function.name
            for node, function in _name_nodes(tree, settings=settings, readers=readers)
            if isinstance(node, ast.Name) and node.id == _first_parameter(function)
        }
        if found <= readers:
            break
        readers |= found
    names: set[str] = set()
    unnamed: list[str] = []
    for node, function in _name_nodes(tree, settings=settings, readers=readers):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)
        elif isinstance(node, ast.Name) and node.id in constants:
            names.add(constants[node.id])
        elif settings and not (
            isinstance(node, ast.Name) and node.id == _first_parameter(function)
        ):
            unnamed.append(f"{path}:{node.lineno}")
    return names, unnamed


def project_modules() -> list[tuple[Path, bool]]:
    """Every module of the project's packages, and whether it is a settings module."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = pyproject["tool"]["importlinter"]["root_packages"]
    modules = [ROOT / "manage.py"]
    for package in packages:
        modules += sorted((ROOT / package).rglob("*.py"))
    return [(m, m.parent == SETTINGS_DIR) for m in modules]


@functools.cache
def code_reads() -> tuple[set[str], list[str]]:
    names: set[str] = set()
    unnamed: list[str] = []
    for module, settings in project_modules():
        found, missed = environment_reads(
            module.read_text(), path=str(module.relative_to(ROOT)), settings=settings
        )
        names |= found
        unnamed += missed
    return names, unnamed


def env_example_names() -> set[str]:
    """Names assigned in .env.example, commented-out examples (`# NAME=`) included."""
    return set(re.findall(r"(?m)^#?\s*([A-Z][A-Z0-9_]*)=", ENV_EXAMPLE.read_text()))


def settings_table_names() -> set[str]:
    """Names in the first column of the settings table in docs/configuration.md."""
    section = CONFIGURATION.read_text().split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", row.split("|")[1])}


def test_every_read_names_its_variable():
    _, unnamed = code_reads()
    assert not unnamed, (
        "environment reads this test cannot name (use a string literal or a "
        f"module-level constant): {', '.join(unnamed)}"
    )


def test_the_settings_are_found_where_they_are_read():
    """The parse sees reads of each kind, so the comparisons below cannot pass
    on an empty list; and each exclusion is still read."""
    names, _ = code_reads()
    assert {
        "DATABASE_URL",  # env(...)
        "DATABASE_POOL",  # env.bool(...)
        "API_KEY_PEPPER",  # production's _required(...)
        "DJANGO_SETTINGS_MODULE",  # os.environ.setdefault(...) in manage.py and config/
    } <= names
    assert names >= NOT_SETTINGS, f"excluded but no longer read: {NOT_SETTINGS - names}"


def test_env_example_lists_every_setting_the_code_reads():
    names, _ = code_reads()
    missing = sorted(names - NOT_SETTINGS - env_example_names())
    assert not missing, (
        f".env.example lacks {', '.join(missing)}: add each with a comment saying what it "
        "does (and a row in the settings table in docs/configuration.md)"
    )


def test_env_example_lists_nothing_the_code_does_not_read():
    names, _ = code_reads()
    stale = sorted(env_example_names() - names)
    assert not stale, f".env.example lists {', '.join(stale)}, which no code reads"


def test_settings_table_lists_every_setting_the_code_reads():
    names, _ = code_reads()
    missing = sorted(names - NOT_SETTINGS - settings_table_names())
    stale = sorted(settings_table_names() - names)
    assert not missing, f"docs/configuration.md's settings table lacks {', '.join(missing)}"
    assert not stale, (
        f"docs/configuration.md's settings table lists {', '.join(stale)}, which no code reads"
    )


SAMPLE_SETTINGS = """
import os
PREFIX = "SAMPLE_PREFIX"
A = env("SAMPLE_PLAIN", default="")
B = env.float("SAMPLE_CAST", default=1.0)
C = env.db(var="SAMPLE_KEYWORD")
def _required(name, *, form):
    return env.str(name, default="")
D = _required("SAMPLE_FORWARDED", form="x")
E = os.environ.get(PREFIX)
F = os.environ["SAMPLE_SUBSCRIPT"]
G = "SAMPLE_IN" in os.environ
H = os.getenv("SAMPLE_GETENV")
os.environ["SAMPLE_WRITTEN"] = "1"
os.environ.pop("SAMPLE_CLEARED", None)
I = env(f"{PREFIX}_DYNAMIC")
"""


def test_the_parse_finds_each_form_of_read_and_flags_an_unnamed_one():
    names, unnamed = environment_reads(SAMPLE_SETTINGS, path="sample.py", settings=True)
    assert names == {
        "SAMPLE_PLAIN",
        "SAMPLE_CAST",
        "SAMPLE_KEYWORD",
        "SAMPLE_FORWARDED",
        "SAMPLE_PREFIX",
        "SAMPLE_SUBSCRIPT",
        "SAMPLE_IN",
        "SAMPLE_GETENV",
    }
    assert unnamed == ["sample.py:16"]  # the f-string
    # Outside config/settings/, `env` is nobody's reader.
    other, unnamed = environment_reads(SAMPLE_SETTINGS, path="sample.py", settings=False)
    assert "SAMPLE_PLAIN" not in other and "SAMPLE_GETENV" in other and unnamed == []
