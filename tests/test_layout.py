"""The package layout the conventions ask for: argument parsing only in the CLI, imports that point
down (no import circle but the registry's registration list)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


def test_argparse_only_in_the_cli():
    users = sorted(
        str(p.relative_to(SRC))
        for p in (SRC / "effiformer").rglob("*.py")
        if "argparse" in p.read_text()
    )
    assert users, "the CLI parses with argparse"
    assert all(u.startswith("effiformer/cli/") for u in users), users


def test_nothing_in_the_library_imports_the_cli():
    for p in (SRC / "effiformer").rglob("*.py"):
        rel = p.relative_to(SRC / "effiformer")
        if rel.parts[0] == "cli" or rel.name == "__main__.py":
            continue
        text = p.read_text()
        assert (
            "from .cli" not in text and "from ..cli" not in text and "effiformer.cli" not in text
        ), rel


def test_no_import_circles(shared_tool):
    tool = shared_tool("import_circles.py")
    proc = subprocess.run(
        [
            sys.executable,
            str(tool),
            "src",
            "effiformer",
            "effiformer.registry",
            "effiformer.models",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 import circle(s)" in proc.stdout


def test_the_ops_floor_imports_only_torch_and_itself():
    """ops/ sits below attention/: its modules import torch and each other, nothing else of
    effiformer (a mechanism importing an op is the only direction)."""
    import ast

    files = sorted((SRC / "effiformer" / "ops").glob("*.py"))
    assert files
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                name = node.module or ""
                if node.level:  # relative: only within ops (level 1)
                    assert node.level == 1, (p.name, name)
                else:
                    assert not name.startswith("effiformer") or name.startswith("effiformer.ops"), (
                        p.name,
                        name,
                    )
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("effiformer") or alias.name.startswith(
                        "effiformer.ops"
                    ), (p.name, alias.name)
