"""Pieces of the benchmark harness behind ``effiformer bench``; the entry is
:mod:`effiformer.benchmark`.

- :mod:`.references`: the plug-in registry of reference rows (public implementations timed beside
  a model or attention layer) and the :class:`~.references.Workload` a cell times.
- :mod:`.cell`: what runs inside one cell's fresh process: build, warm up, count FLOPs, measure the
  peak memory of one step, time forward and forward+backward.
- :mod:`.report`: the aligned text table and the log-log plot.
"""
