"""The benchmark harness behind ``effiformer bench``: time, memory and FLOPs of registered models
(or one attention layer of each) against sequence length, beside reference rows, and the
decoding latency of encoder-decoder models.

- :mod:`.harness`: :func:`run_bench` plans the cells, runs each in a fresh process
  (``python -m effiformer.bench --cell``), and writes ``results.jsonl`` and the plot.
- :mod:`.references`: the plug-in registry of reference rows (public implementations timed beside
  a model or attention layer, HF's Funnel and Marian among them) and the :class:`Workload` a
  cell times.
- :mod:`.cell`: what runs inside one cell's process: build, warm up, count FLOPs, measure the peak
  memory of one step, time forward and forward+backward (or whole translations).
- :mod:`.decoding`: HAT's decoding-latency measurement (``--part decoding``).
- :mod:`.report`: the aligned text table, the reference list and the log-log plot.

The mechanisms' reference modules in :data:`BUILTIN_REFERENCE_MODULES` are imported here, so
their rows are available without ``--plugin``; a module that is not in this tree yet is
skipped (a reference whose *package* is missing is a skipped row, see :mod:`.references`).
"""

import importlib

from .cell import DTYPES, MEMORY_METHODS, load_plugin
from .harness import (
    DECODING_RUNS,
    DECODING_WARMUP,
    DEFAULT_LENGTHS,
    DEFAULT_MECHANISMS,
    DEFAULT_NAMES,
    DEFAULT_REFS,
    DEFAULT_REPEATS,
    DEFAULT_SET_LENGTHS,
    DEFAULT_WARMUP,
    NOISY_SPREAD,
    BenchInterrupted,
    BenchResult,
    BenchRow,
    OutputExistsError,
    default_rows,
    environment,
    estimate_cell_bytes,
    measure_peak,
    measure_peak_tflops,
    resolve_names,
    run_bench,
    sample_spread,
)
from .references import (
    PARTS,
    TRAINING_PARTS,
    CellSpec,
    Reference,
    Workload,
    list_references,
    missing_requirements,
    register_reference,
)
from .report import format_references, format_summary, format_table, plot_results

#: Reference modules of the mechanisms, imported with this package (``effiformer.bench.X``).
BUILTIN_REFERENCE_MODULES = (
    "sparse_references",  # local-attention beside sparse/vanilla attention layers
    "routing_references",  # routing-transformer beside routing-* attention layers
    "adaptive_span_references",  # span-0s / span-0.1s / span-1.0s beside adaptive-span-*
    "reformer_references",  # reformer-pytorch, hf-reformer-lsh (lands with mech-reformer)
)


def _import_builtin_references() -> None:
    for module in BUILTIN_REFERENCE_MODULES:
        full = f"{__name__}.{module}"
        try:
            importlib.import_module(full)
        except ModuleNotFoundError as e:
            if e.name != full:  # the module exists but something it imports does not
                raise


_import_builtin_references()

__all__ = [
    "BUILTIN_REFERENCE_MODULES",
    "DECODING_RUNS",
    "DECODING_WARMUP",
    "DEFAULT_LENGTHS",
    "DEFAULT_MECHANISMS",
    "DEFAULT_NAMES",
    "DEFAULT_SET_LENGTHS",
    "DEFAULT_REFS",
    "DEFAULT_REPEATS",
    "DEFAULT_WARMUP",
    "DTYPES",
    "MEMORY_METHODS",
    "NOISY_SPREAD",
    "PARTS",
    "TRAINING_PARTS",
    "BenchInterrupted",
    "BenchResult",
    "BenchRow",
    "CellSpec",
    "OutputExistsError",
    "Reference",
    "Workload",
    "default_rows",
    "environment",
    "estimate_cell_bytes",
    "format_references",
    "format_summary",
    "format_table",
    "list_references",
    "load_plugin",
    "measure_peak",
    "measure_peak_tflops",
    "missing_requirements",
    "plot_results",
    "register_reference",
    "resolve_names",
    "run_bench",
    "sample_spread",
]
