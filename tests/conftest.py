"""What tests share: the real data sets and tools in ``../shared`` beside the checkout.

Tests that read real data (PTB, GLUE, tinyshakespeare, Multi30k) or the shared tools get them
from the ``shared_data`` / ``shared_tool`` fixtures, never from a path of their own:

* ``EFFIFORMER_DATA`` points at the data folder (default: ``../shared/data`` beside the
  checkout); the tools are looked up in ``../shared/tools``.
* Where a file is missing the test is skipped with a message naming what is missing and how to
  point at it, so the suite passes in a clone without the data (``pytest -ra`` lists the skips).
* ``bench_script("name")`` loads ``benchmarks/name.py`` as a module (each call a fresh one), for
  the tests that drive a benchmark script through its ``main``.
* ``one_thread`` runs a test on one torch thread and ``keep_threads`` restores the thread count a
  script under test changes (``pytestmark = pytest.mark.usefixtures("one_thread")``).
* ``EFFIFORMER_REQUIRE_DATA=1`` (``.ci/run`` sets it; CI always has ``../shared``) turns those
  skips into failures, so CI proves everything the data tests prove.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DATA_ENV = "EFFIFORMER_DATA"
REQUIRE_ENV = "EFFIFORMER_REQUIRE_DATA"


def data_root() -> Path:
    """The real-data folder: ``$EFFIFORMER_DATA``, else ``../shared/data`` beside the checkout."""
    return Path(os.environ[DATA_ENV]) if os.environ.get(DATA_ENV) else SHARED / "data"


def _required() -> bool:
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _missing(message: str) -> None:
    if _required():
        pytest.fail(f"{message} ({REQUIRE_ENV} is set, so missing shared files are errors)")
    skip = pytest.skip.Exception
    try:  # report the test's location, not this line (what @pytest.mark.skip does)
        exc = skip(message, _use_item_location=True)
    except TypeError:  # a pytest without the keyword
        exc = skip(message)
    raise exc


class SharedData:
    """``shared_data("glue/SST-2")`` -> the path, or skip (fail under ``EFFIFORMER_REQUIRE_DATA``)
    naming what is missing; ``shared_data.root`` is the data folder."""

    @property
    def root(self) -> Path:
        return data_root()

    def __call__(self, name: str) -> Path:
        path = self.root / name
        if not path.exists():
            how = (
                f"{DATA_ENV}={os.environ[DATA_ENV]} has no {name}"
                if os.environ.get(DATA_ENV)
                else f"set {DATA_ENV}=/path/to/data (a folder holding {name}) or put the data "
                "in ../shared/data beside the checkout"
            )
            _missing(f"needs the real data set {name!r}, not found at {path}: {how}")
        return path


@pytest.fixture(scope="session")
def shared_data() -> SharedData:
    """See :class:`SharedData`."""
    return SharedData()


@pytest.fixture(scope="session")
def shared_tool():
    """``shared_tool("import_circles.py")`` -> ``../shared/tools/NAME``, or skip (fail under
    ``EFFIFORMER_REQUIRE_DATA``) naming what is missing."""

    def get(name: str) -> Path:
        path = SHARED / "tools" / name
        if not path.is_file():
            _missing(
                f"needs the shared tool {name!r}, not found at {path} (../shared/tools beside "
                "the checkout)"
            )
        return path

    return get


@pytest.fixture
def data_env(shared_data, monkeypatch):
    """For benchmark scripts that resolve ``EFFIFORMER_DATA`` when loaded: ``data_env(name)``
    checks that ``name`` is there (skip/fail as above) and exports the data folder."""

    def get(name: str) -> Path:
        path = shared_data(name)
        monkeypatch.setenv(DATA_ENV, str(shared_data.root))
        return path

    return get


@pytest.fixture(scope="session")
def bench_script():
    """``bench_script("quality_extend")`` -> ``benchmarks/quality_extend.py`` loaded as a fresh
    module (its own module-level state each call)."""

    def load(name: str):
        path = ROOT / "benchmarks" / f"{name}.py"
        if not path.is_file():
            raise FileNotFoundError(f"no benchmark script {path}")
        spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def keep_threads():
    """Restore torch's intra-op thread count after the test (a script under test may set it)."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture
def one_thread(keep_threads):
    """Run the test on one torch thread (and restore the count after)."""
    import torch

    torch.set_num_threads(1)
