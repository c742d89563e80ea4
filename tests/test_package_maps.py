"""The maps a reader finds files by stay true: each package's docstring, the README's and docs/architecture.md's
tables name every module, and every command in the CLI table resolves (test_cli_surface.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "groundup"
PACKAGES = sorted(p for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def _units() -> set[str]:
    """What the tables name: every sub-package as `name/`, every module directly under groundup/ as `name.py`."""
    modules = {f"{p.name}" for p in PACKAGE.glob("*.py") if p.name != "__init__.py"}
    return modules | {f"{p.name}/" for p in PACKAGES}


def _table(path: Path, heading: str) -> str:
    text = path.read_text()
    match = re.search(rf"## {heading}\n(.*?)\n## ", text, re.S)
    assert match, f"{path}: no '## {heading}' section"
    return match.group(1)


def test_every_directory_of_modules_is_a_package():
    loose = [p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"
             and any(p.glob("*.py")) and not (p / "__init__.py").exists()]
    assert not loose, f"directories of modules without an __init__.py (and so without a map): {loose}"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_each_package_docstring_maps_its_modules(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    missing = [p.name for p in sorted(package.glob("*.py")) if p.name != "__init__.py" and p.name not in doc]
    assert not missing, f"{package.name}/__init__.py's docstring does not name {missing}"


@pytest.mark.parametrize("path, heading", [("README.md", "Where things live"),
                                           ("docs/architecture.md", "Where things live")])
def test_the_tables_name_every_package_and_module(path, heading):
    table = _table(ROOT / path, heading)
    named = set(re.findall(r"`(?:groundup/)?([\w]+/|[\w]+\.py)`", table))
    missing = sorted(_units() - named)
    assert not missing, f"{path} '{heading}' does not name {missing}"
    stale = sorted(n for n in named - _units() if not (PACKAGE / n.rstrip("/")).exists())
    assert not stale, f"{path} '{heading}' names what does not exist: {stale}"
