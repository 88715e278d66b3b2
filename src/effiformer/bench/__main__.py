"""``python -m effiformer.bench --cell CELL.json --result RESULT.json``: the per-cell process the
harness spawns (:func:`effiformer.bench.cell.cell_main`). Run benchmarks with ``effiformer bench``."""

import sys

from .cell import cell_main

if __name__ == "__main__":
    sys.exit(cell_main(sys.argv[1:]))
