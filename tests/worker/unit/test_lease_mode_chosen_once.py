"""The lease mode is chosen once (issue 22 §4): worker/main.py builds the Ownership for it, and
settings.py validates it. Every other module asks the Ownership what differs (lease/ownership.py),
so no module outside those, and outside the two implementations, compares the running mode."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "worker_src" / "leaseworker"
CHOOSES = {"worker/main.py", "settings.py"}  # the choice, and its validation
MODES = {"connection", "session"}


def mode_tests(tree: ast.AST) -> list[int]:
    """Lines comparing a running mode (`x.lease_mode`, `x.mode`) with a mode's name."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        reads_mode = any(isinstance(o, ast.Attribute) and o.attr in ("lease_mode", "mode") for o in operands)
        names = {o.value for o in ast.walk(node) if isinstance(o, ast.Constant) and isinstance(o.value, str)}
        if reads_mode and names & MODES:
            found.append(node.lineno)
    return found


def test_only_the_module_that_builds_the_ownership_tests_the_lease_mode() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in CHOOSES:
            continue
        lines = mode_tests(ast.parse(path.read_text(), relative))
        if lines:
            offenders[relative] = lines
    assert offenders == {}


def test_the_check_finds_a_mode_test() -> None:
    source = (
        'if self._settings.lease_mode == "session":\n    pass\nok = settings.lease_mode in ("connection",)\n'
    )
    assert mode_tests(ast.parse(source)) == [1, 3]
