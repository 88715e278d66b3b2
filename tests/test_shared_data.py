"""The shared-data fixture (tests/conftest.py): a missing data set skips with a message naming
it and how to point at it; EFFIFORMER_REQUIRE_DATA=1 (what .ci/run sets) makes it a failure."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

TEST = """
def test_needs_data(shared_data):
    assert shared_data("ptb").is_dir()
"""


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text(TEST)
    base = {k: v for k, v in os.environ.items() if not k.startswith("EFFIFORMER_")}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "test_x.py"],
        cwd=tmp_path,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_data_set_is_a_named_skip_or_under_ci_a_failure(tmp_path):
    missing = tmp_path / "nowhere"
    skipped = _pytest(tmp_path, EFFIFORMER_DATA=str(missing))
    assert skipped.returncode == 0, skipped.stdout
    assert "1 skipped" in skipped.stdout
    assert f"needs the real data set 'ptb', not found at {missing / 'ptb'}" in skipped.stdout
    assert f"EFFIFORMER_DATA={missing} has no ptb" in skipped.stdout
    assert "test_x.py:2" in skipped.stdout  # reported at the test, not in conftest.py

    default = _pytest(tmp_path)  # tmp_path has no ../shared beside it
    assert "set EFFIFORMER_DATA=/path/to/data" in default.stdout, default.stdout

    failed = _pytest(tmp_path, EFFIFORMER_DATA=str(missing), EFFIFORMER_REQUIRE_DATA="1")
    assert failed.returncode == 1 and "1 failed" in failed.stdout
    assert "EFFIFORMER_REQUIRE_DATA is set, so missing shared files are errors" in failed.stdout

    (missing / "ptb").mkdir(parents=True)
    found = _pytest(tmp_path, EFFIFORMER_DATA=str(missing), EFFIFORMER_REQUIRE_DATA="1")
    assert found.returncode == 0 and "1 passed" in found.stdout
