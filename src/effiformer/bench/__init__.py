"""The benchmark harness behind ``effiformer bench``: time, memory and FLOPs of registered models
(or one attention layer of each) against sequence length, beside reference rows.

- :mod:`.harness`: :func:`run_bench` plans the cells, runs each in a fresh process
  (``python -m effiformer.bench --cell``), and writes ``results.jsonl`` and the plot.
- :mod:`.references`: the plug-in registry of reference rows (public implementations timed beside
  a model or attention layer, HF's Funnel among them) and the :class:`Workload` a cell times.
- :mod:`.cell`: what runs inside one cell's process: build, warm up, count FLOPs, measure the peak
  memory of one step, time forward and forward+backward.
- :mod:`.report`: the aligned text table, the reference list and the log-log plot.
"""

from .cell import DTYPES, MEMORY_METHODS, load_plugin
from .harness import (
    DEFAULT_LENGTHS,
    DEFAULT_NAMES,
    DEFAULT_REFS,
    BenchResult,
    environment,
    estimate_cell_bytes,
    measure_peak_tflops,
    resolve_names,
    run_bench,
)
from .references import (
    PARTS,
    CellSpec,
    Reference,
    Workload,
    list_references,
    missing_requirements,
    register_reference,
)
from .report import format_references, format_table, plot_results

__all__ = [
    "DEFAULT_LENGTHS",
    "DEFAULT_NAMES",
    "DEFAULT_REFS",
    "DTYPES",
    "MEMORY_METHODS",
    "PARTS",
    "BenchResult",
    "CellSpec",
    "Reference",
    "Workload",
    "environment",
    "estimate_cell_bytes",
    "format_references",
    "format_table",
    "list_references",
    "load_plugin",
    "measure_peak_tflops",
    "missing_requirements",
    "plot_results",
    "register_reference",
    "resolve_names",
    "run_bench",
]
