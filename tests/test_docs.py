"""Every ```python example in README.md and docs/*.md runs as written."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```python\n(.*?)```", re.S)
EXAMPLES = [(p, i, code) for p in DOCS for i, code in enumerate(BLOCK.findall(p.read_text()))]


@pytest.mark.parametrize("path,index,code", EXAMPLES, ids=[f"{p.name}-{i}" for p, i, _ in EXAMPLES])
def test_example_runs(path, index, code, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{path.name} example {index} failed:\n{proc.stderr[-3000:]}"


def test_docs_have_examples():
    assert len(EXAMPLES) >= 3
