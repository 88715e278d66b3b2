"""Language-modelling data: corpora in their real formats, vocabularies and batching.

``load_corpus(path, format)`` reads ``enwik8``, ``text8``, ``ptb``, ``ptb-char``, ``wikitext``
or ``text`` into a :class:`Corpus` (three 1-D id tensors, a :class:`Vocab`, a fingerprint);
``embedded_corpus()`` needs no files. Translation: :class:`ParallelData` (aligned files by split
and language), :func:`train_joint_tokenizer`, :class:`TokenBatcher` (token-budget batches). :class:`StreamBatcher`, :class:`WindowBatcher` and
:func:`eval_batches` turn a split into ``(x, y)`` batches of shape ``(B, T)``.
"""

from .batching import StreamBatcher, WindowBatcher, eval_batches
from .corpora import (
    FORMATS,
    Corpus,
    CorpusError,
    Vocab,
    embedded_corpus,
    load_corpus,
    read_enwik8,
    read_ptb,
    read_ptb_char,
    read_text,
    read_text8,
    read_wikitext,
)
from .parallel import (
    ParallelData,
    ParallelDataError,
    ParallelSplit,
    TokenBatcher,
    read_lines,
    read_parallel,
    train_joint_tokenizer,
)

__all__ = [
    "FORMATS",
    "ParallelData",
    "ParallelDataError",
    "ParallelSplit",
    "TokenBatcher",
    "read_lines",
    "read_parallel",
    "train_joint_tokenizer",
    "Corpus",
    "CorpusError",
    "StreamBatcher",
    "Vocab",
    "WindowBatcher",
    "embedded_corpus",
    "eval_batches",
    "load_corpus",
    "read_enwik8",
    "read_ptb",
    "read_ptb_char",
    "read_text",
    "read_text8",
    "read_wikitext",
]
