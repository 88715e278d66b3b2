"""``python -m effiformer.bench --cell CELL.json --result RESULT.json``: the per-cell process the
harness spawns (:func:`effiformer.bench.cell.cell_main`; a quality-suite cell, ``kind="quality"``,
runs :func:`effiformer.bench.quality.run_quality_cell`). Run benchmarks with ``effiformer bench``."""

import sys

from .cell import cell_main
from .quality import run_quality_cell, run_quality_timing

if __name__ == "__main__":
    sys.exit(
        cell_main(sys.argv[1:], {"quality": run_quality_cell, "quality-timing": run_quality_timing})
    )
