"""Static check: everything the worker imports at run time is pinned in worker_src/requirements.txt.

The image installs only that file plus the package with --no-deps (docs/design.md §10), so a
third-party import outside `if TYPE_CHECKING:` that maps to any other distribution (type stubs,
moto, pytest) crashes every task at start, while every test in the dev venv still passes.

Imports are collected with `ast` from every module, at any depth (function-level imports
included), except in the body of an `if TYPE_CHECKING:` block (its `else:` runs). Each import is
mapped to the distribution that ships it with `importlib.metadata.packages_distributions()`;
where several distributions share a top-level name (`opentelemetry`, `google`), the one whose
file list ships the imported module wins.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "worker_src" / "leaseworker"
REQUIREMENTS = REPO / "worker_src" / "requirements.txt"
PYPROJECT = REPO / "worker_src" / "pyproject.toml"
DEV_REQUIREMENTS = REPO / "requirements-dev.txt"
DEV_PYPROJECT = REPO / "dev_src" / "pyproject.toml"
FIRST_PARTY = "leaseworker"
# The development package is never in the image; the product imports it in one place only, guarded
# by ModuleNotFoundError (`leaseworker local` says how to get it; tests/image/test_image_env.py).
GUARDED_DEV_IMPORTS = {("leaseworker_dev.cli", "worker_src/leaseworker/cli/main.py")}
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;#]+)")


def canonical(name: str) -> str:
    """PEP 503 normalisation: `aws_lambda_powertools` and `aws-lambda-powertools` are one name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lines: Sequence[str]) -> dict[str, str]:
    """canonical name -> version of every `name==version` line (comments and `-r`/`-e` skipped)."""
    found: dict[str, str] = {}
    for raw in lines:
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = PIN.match(line)
        assert match, f"not an exact pin: {raw!r}"
        found[canonical(match.group(1))] = match.group(3)
    return found


@dataclass(frozen=True)
class RuntimeImport:
    module: str
    where: str  # file:line

    @property
    def top(self) -> str:
        return self.module.split(".", 1)[0]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    def __init__(self, where: str) -> None:
        self.where = where
        self.found: list[RuntimeImport] = []

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for child in node.orelse:  # only the body is for type checkers
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [RuntimeImport(alias.name, f"{self.where}:{node.lineno}") for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:  # relative imports are first-party
            self.found.append(RuntimeImport(node.module, f"{self.where}:{node.lineno}"))


def runtime_imports(source: str, where: str) -> list[RuntimeImport]:
    """Every absolute import in `source` that runs at run time."""
    collector = _Collector(where)
    collector.visit(ast.parse(source, filename=where))
    return collector.found


def third_party(imports: list[RuntimeImport]) -> list[RuntimeImport]:
    return [
        imp
        for imp in imports
        if imp.top not in sys.stdlib_module_names
        and imp.top not in (FIRST_PARTY, "__future__")
        and (imp.module, imp.where.rsplit(":", 1)[0]) not in GUARDED_DEV_IMPORTS
    ]


@cache
def _top_level_map() -> Mapping[str, list[str]]:
    return importlib.metadata.packages_distributions()


@cache
def _shipped(distribution: str) -> frozenset[str]:
    files = importlib.metadata.distribution(distribution).files or []
    return frozenset(str(f) for f in files)


def owners(module: str) -> set[str]:
    """The canonical names of the distributions that ship `module` (empty: installed by none)."""
    parts = module.split(".")
    candidates = _top_level_map().get(parts[0], [])
    if len(candidates) > 1:  # a namespace shared by several distributions
        for depth in range(len(parts), 1, -1):
            prefix = "/".join(parts[:depth])
            shipping = [
                d
                for d in candidates
                if any(f.startswith((prefix + "/", prefix + ".py")) for f in _shipped(d))
            ]
            if shipping:
                candidates = shipping
                break
    return {canonical(d) for d in candidates}


def violations(imports: list[RuntimeImport], pinned: Mapping[str, str]) -> list[str]:
    """One line per run-time third-party import that no pinned distribution provides."""
    problems = []
    for imp in third_party(imports):
        shipping = owners(imp.module)
        if not shipping:
            problems.append(f"{imp.where}: `{imp.module}` is provided by no installed distribution")
        elif not shipping & pinned.keys():
            problems.append(
                f"{imp.where}: `{imp.module}` comes from {', '.join(sorted(shipping))}, "
                "which worker_src/requirements.txt does not pin (import it under TYPE_CHECKING?)"
            )
    return problems


def package_imports() -> Iterator[RuntimeImport]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield from runtime_imports(path.read_text(encoding="utf-8"), str(path.relative_to(REPO)))


def requirement_pins() -> dict[str, str]:
    return pins(REQUIREMENTS.read_text(encoding="utf-8").splitlines())


# ---------------------------------------------------------------- the package itself


def test_every_runtime_import_of_the_worker_is_pinned_in_its_requirements() -> None:
    imports = list(package_imports())
    assert len(third_party(imports)) > 20  # the walk really found the package's imports
    assert violations(imports, requirement_pins()) == []


def test_the_packages_declared_dependencies_are_pinned_at_the_same_versions() -> None:
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    declared = pins(project["dependencies"])
    pinned = requirement_pins()
    assert {name: pinned.get(name) for name in declared} == declared


def test_the_development_package_pins_moto_as_the_dev_requirements_do() -> None:
    project = tomllib.loads(DEV_PYPROJECT.read_text(encoding="utf-8"))["project"]
    declared = pins(project["dependencies"])
    dev = pins(DEV_REQUIREMENTS.read_text(encoding="utf-8").splitlines())
    assert declared == {"moto": dev["moto"]}
    assert "moto" not in requirement_pins()  # the image never carries it


# ---------------------------------------------------------------- the check can fail

PINNED = {"aioboto3": "15.5.0", "botocore": "1.40.61", "opentelemetry-sdk": "1.45.2"}


@pytest.mark.parametrize(
    ("source", "flagged"),
    [
        ("from types_aiobotocore_dynamodb import DynamoDBClient\n", ["types-aiobotocore-dynamodb"]),
        ("def local():\n    import moto.server\n", ["moto"]),
        ("class C:\n    def m(self):\n        from pytest import fixture\n", ["pytest"]),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n    import pexpect\n",
            ["pexpect"],
        ),
        ("try:\n    import yaml\nexcept ImportError:\n    yaml = None\n", ["pyyaml"]),
        # A distribution sharing a pinned namespace is still told apart from it.
        (
            "from opentelemetry.sdk.trace import TracerProvider\nimport opentelemetry.proto\n",
            ["opentelemetry-proto"],
        ),
        ("import no_such_module_anywhere\n", ["no installed distribution"]),
    ],
)
def test_the_check_flags_unpinned_runtime_imports(source: str, flagged: list[str]) -> None:
    (problem,) = violations(runtime_imports(source, "synthetic.py"), PINNED)
    assert all(name in problem for name in flagged), problem
    assert problem.startswith("synthetic.py:")


@pytest.mark.parametrize(
    "source",
    [
        "from __future__ import annotations\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from types_aiobotocore_dynamodb import DynamoDBClient\n",
        "import typing\nif typing.TYPE_CHECKING:\n    import moto\n",
        "import aioboto3\nfrom botocore.exceptions import ClientError\nimport asyncio, json\n",
        "from opentelemetry.sdk.resources import Resource\nfrom . import sibling\n",
        "from leaseworker import x\nfrom leaseworker.health import judge\n",
    ],
)
def test_the_check_passes_stub_imports_for_type_checkers_and_pinned_ones(source: str) -> None:
    assert violations(runtime_imports(source, "synthetic.py"), PINNED) == []
