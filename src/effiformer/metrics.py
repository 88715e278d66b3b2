"""Evaluation metrics, computed by the libraries GLUE's own evaluation uses: scikit-learn
(``accuracy_score``, ``f1_score``, ``matthews_corrcoef``) and SciPy (``pearsonr``, ``spearmanr``);
translation metrics from sacreBLEU (Post 2018, arXiv 1804.08771), :func:`translation_scores`.

Every function takes ``(pred, target)`` 1-D sequences of the same length and checks them at this
boundary (shapes, empty input, binary labels for F1 and MCC); the arithmetic is the libraries'.
Conventions where a value is undefined, as GLUE's scorer: F1 is 0 when no positive is predicted or
present (``zero_division=0``), MCC is 0 for a constant prediction or target, Pearson and Spearman
are ``nan`` when a side is constant (computed as such here, without SciPy's warning).

The libraries are imported on first use, so importing this module (and the CLI) stays fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .data.glue import glue_spec

__all__ = [
    "METRICS",
    "accuracy",
    "f1_score",
    "glue_metrics",
    "matthews_corrcoef",
    "pearson",
    "spearman",
    "translation_scores",
]

ArrayLike = Sequence[float] | np.ndarray


def _pair(pred: ArrayLike, target: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    p, t = np.asarray(pred), np.asarray(target)
    if p.shape != t.shape or p.ndim != 1:
        raise ValueError(
            f"predictions and targets must be 1-D of the same length, got {p.shape} and {t.shape}"
        )
    if p.size == 0:
        raise ValueError("cannot score an empty set of predictions")
    return p, t


def _binary(p: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    for name, a in (("predictions", p), ("targets", t)):
        if not np.isin(a, (0, 1)).all():
            raise ValueError(f"binary {name} must be 0 or 1, got values {np.unique(a).tolist()}")
    return p.astype(np.int64), t.astype(np.int64)


def accuracy(pred: ArrayLike, target: ArrayLike) -> float:
    """Fraction of ``pred == target`` (``sklearn.metrics.accuracy_score``)."""
    from sklearn.metrics import accuracy_score

    p, t = _pair(pred, target)
    return float(accuracy_score(t, p))


def f1_score(pred: ArrayLike, target: ArrayLike) -> float:
    """F1 of the positive class 1 (``sklearn.metrics.f1_score``, binary, ``zero_division=0``)."""
    from sklearn.metrics import f1_score as sk_f1

    p, t = _binary(*_pair(pred, target))
    return float(sk_f1(t, p, pos_label=1, average="binary", labels=[0, 1], zero_division=0))


def matthews_corrcoef(pred: ArrayLike, target: ArrayLike) -> float:
    """Matthews correlation of binary labels (``sklearn.metrics.matthews_corrcoef``; 0 for a
    constant prediction or target)."""
    from sklearn.metrics import matthews_corrcoef as sk_mcc

    p, t = _binary(*_pair(pred, target))
    return float(sk_mcc(t, p))


def _constant(a: np.ndarray) -> bool:
    return bool(np.all(a == a[0]))


def pearson(pred: ArrayLike, target: ArrayLike) -> float:
    """Pearson's r in float64 (``scipy.stats.pearsonr``); ``nan`` when a side is constant."""
    from scipy.stats import pearsonr

    p, t = (a.astype(np.float64) for a in _pair(pred, target))
    if p.size < 2 or _constant(p) or _constant(t):
        return math.nan
    return float(pearsonr(p, t).statistic)


def spearman(pred: ArrayLike, target: ArrayLike) -> float:
    """Spearman's rho (``scipy.stats.spearmanr``: Pearson's r of the average ranks, ties sharing
    their mean rank); ``nan`` when a side is constant."""
    from scipy.stats import spearmanr

    p, t = (a.astype(np.float64) for a in _pair(pred, target))
    if p.size < 2 or _constant(p) or _constant(t):
        return math.nan
    return float(spearmanr(p, t).statistic)


METRICS: dict[str, Callable[[ArrayLike, ArrayLike], float]] = {
    "accuracy": accuracy,
    "f1": f1_score,
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def glue_metrics(task: str, pred: ArrayLike, target: ArrayLike) -> dict[str, float]:
    """Every metric of GLUE ``task`` (headline first): class ids for classification, scores for
    STS-B."""
    spec = glue_spec(task)
    return {m: METRICS[m](np.asarray(pred), np.asarray(target)) for m in spec.metrics}


def compound_split(text: str) -> str:
    """Split hyphenated compounds the way the WMT En-De papers score (fairseq's
    ``compound_split_bleu.sh``, tensor2tensor's ``get_ende_bleu.sh``): ``a-b`` becomes
    ``a ##AT##-##AT## b``, so the halves of a German compound count as separate n-grams."""
    import re

    # one pass, matches not overlapping, as perl's s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g
    return re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", text)


def tokenized_bleu(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """``{"bleu_tok", "bleu_tok_signature"}``: BLEU on tokenized, compound-split text with no
    further tokenization, the convention behind the WMT'14 En-De figures of Vaswani et al. 2017,
    Lite Transformer and HAT (they score Moses-tokenized output with ``multi-bleu.perl`` after
    :func:`compound_split`). Here the text is tokenized with sacreBLEU's ``13a`` tokenizer (the
    mteval one; Moses differs in a few rules, so the figure is close to, not equal to, the
    papers'), then compound-split, then scored with ``tokenize="none"``, no smoothing beyond
    sacreBLEU's default. sacreBLEU's own BLEU stays the headline figure."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tok = Tokenizer13a()
    hyps = [compound_split(tok(h)) for h in hypotheses]
    refs = [[compound_split(tok(r)) for r in references]]
    bleu = BLEU(tokenize="none")
    return {
        "bleu_tok": bleu.corpus_score(hyps, refs).score,
        "bleu_tok_signature": str(bleu.get_signature()) + "|tok:13a+compound-split",
    }


def translation_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """``{"bleu", "chrf", "bleu_signature", "chrf_signature", "bleu_tok",
    "bleu_tok_signature"}`` of detokenized ``hypotheses`` against ``references`` (one per
    hypothesis) with sacreBLEU's defaults (BLEU: 13a tokenization, mixed case, exponential
    smoothing; chrF: character 6-grams, beta 2), and the papers' tokenized compound-split BLEU
    beside them (:func:`tokenized_bleu`); the signatures say exactly how a figure was computed."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses) != len(references):
        raise ValueError(
            f"one reference per hypothesis: {len(hypotheses)} hypotheses, {len(references)} "
            "references"
        )
    if not hypotheses:
        raise ValueError("no hypotheses to score")
    bleu, chrf = BLEU(), CHRF()
    hyps, refs = list(hypotheses), [list(references)]
    return {
        "bleu": bleu.corpus_score(hyps, refs).score,
        "chrf": chrf.corpus_score(hyps, refs).score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        **tokenized_bleu(hyps, refs[0]),
    }
