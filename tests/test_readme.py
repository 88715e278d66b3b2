"""The README's first example is not a copy task: trained as written for 100 steps on random
bytes its loss stays at the entropy of the data, while the same loop with ``targets=input_ids``
(the old, wrong convention) learns to copy and falls far below it."""

import math
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def _first_example() -> str:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]


def _final_loss(code: str, tmp_path) -> float:
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return float(re.search(r"loss ([0-9.]+) nats", proc.stdout).group(1))


def test_readme_example_stays_at_the_entropy_of_random_data(tmp_path):
    code = _first_example()
    assert "targets=ids[:, 1:]" in code
    loss = _final_loss(code, tmp_path)
    assert loss > math.log(256) - 0.15, loss  # cannot beat the entropy of uniform bytes
    copy = code.replace("model(ids[:, :-1], targets=ids[:, 1:])", "model(ids, targets=ids)")
    assert copy != code
    copy_loss = _final_loss(copy, tmp_path)
    assert copy_loss < math.log(256) - 1.0, copy_loss  # the copy task is learnable: detectable
