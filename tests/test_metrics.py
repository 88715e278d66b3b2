"""The metrics (scikit-learn / SciPy underneath): hand-computed values, the GLUE per-task
selection, and agreement with the hand-written metrics they replaced on the real dev sets.

The oracle: ``old_*`` below are the hand-written implementations that ``effiformer.tasks.glue``
held until the metrics moved onto scikit-learn and SciPy, kept here verbatim (renamed) only to
check the library values against them. The figures in ``FIGURES`` were computed once with these
old functions on the predictions of fixed simple rules (majority class, a hashed pseudo-random
prediction, a length-ratio score for STS-B); both the oracle and the library must reproduce them
to 1e-12.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from effiformer.data.glue import read_glue
from effiformer.metrics import (
    accuracy,
    f1_score,
    glue_metrics,
    matthews_corrcoef,
    pearson,
    spearman,
)

FOLDERS = {"sst2": "SST-2", "cola": "CoLA", "rte": "RTE", "stsb": "STS-B", "mrpc": "MRPC"}


# ---- by hand ------------------------------------------------------------------------------


def test_classification_metrics_by_hand() -> None:
    pred, target = [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0]  # TP 2, FP 1, FN 1, TN 2
    assert accuracy(pred, target) == pytest.approx(4 / 6, abs=1e-15)
    assert f1_score(pred, target) == pytest.approx(4 / 6, abs=1e-15)  # 2*2 / (4 + 1 + 1)
    assert matthews_corrcoef(pred, target) == pytest.approx(1 / 3, abs=1e-15)  # (4-1)/sqrt(81)
    assert matthews_corrcoef([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0  # constant prediction
    assert matthews_corrcoef([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0, abs=1e-15)
    assert f1_score([0, 0], [0, 0]) == 0.0
    pred2, target2 = [1, 0, 1, 1, 1], [1, 1, 1, 0, 0]  # TP 2, FP 2, FN 1, TN 0
    assert f1_score(pred2, target2) == pytest.approx(4 / 7, abs=1e-15)
    assert matthews_corrcoef(pred2, target2) == pytest.approx(-2 / math.sqrt(4 * 3 * 2 * 1))
    with pytest.raises(ValueError, match="binary predictions must be 0 or 1"):
        f1_score([2, 0], [1, 0])
    with pytest.raises(ValueError, match="same length"):
        accuracy([1, 0], [1])


def test_regression_metrics_by_hand() -> None:
    assert pearson([1, 2, 3], [2, 4, 7]) == pytest.approx(15 / math.sqrt(228), abs=1e-15)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))
    # Ties use average ranks: x ranks [1, 2.5, 2.5, 4], y ranks [1, 3, 2, 4] -> rho = sqrt(0.9).
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(math.sqrt(0.9), abs=1e-15)
    assert spearman([1, 5, 9, 10], [0.1, 0.2, 0.3, 7.0]) == pytest.approx(1.0, abs=1e-15)
    assert spearman([3, 2, 1], [1, 2, 3]) == pytest.approx(-1.0, abs=1e-15)


def test_glue_metrics_per_task() -> None:
    assert glue_metrics("sst2", [1, 0], [1, 1]) == {"accuracy": 0.5}
    mrpc = glue_metrics("mrpc", [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0])
    assert list(mrpc) == ["f1", "accuracy"] and mrpc["f1"] == pytest.approx(2 / 3)
    cola = glue_metrics("cola", [1, 1, 0, 0, 1, 0], [1, 0, 0, 1, 1, 0])
    assert list(cola) == ["mcc", "accuracy"] and cola["mcc"] == pytest.approx(1 / 3)
    sts = glue_metrics("stsb", [1.0, 2.0, 2.0, 3.0], [1.0, 3.0, 2.0, 4.0])
    assert list(sts) == ["pearson", "spearman"]
    assert sts["spearman"] == pytest.approx(math.sqrt(0.9))


# ---- the hand-written metrics these replaced (the oracle) ---------------------------------


def _old_pair(pred: Sequence | np.ndarray, target: Sequence | np.ndarray) -> tuple[np.ndarray, ...]:
    p, t = np.asarray(pred), np.asarray(target)
    if p.shape != t.shape or p.ndim != 1:
        raise ValueError(
            f"predictions and targets must be 1-D of the same length, got {p.shape} and {t.shape}"
        )
    if p.size == 0:
        raise ValueError("cannot score an empty set of predictions")
    return p, t


def old_accuracy(pred: Sequence[int] | np.ndarray, target: Sequence[int] | np.ndarray) -> float:
    """Fraction of ``pred == target``."""
    p, t = _old_pair(pred, target)
    return float(np.mean(p == t))


def _old_confusion(p: np.ndarray, t: np.ndarray) -> tuple[int, int, int, int]:
    for name, a in (("predictions", p), ("targets", t)):
        if not np.isin(a, (0, 1)).all():
            raise ValueError(f"binary {name} must be 0 or 1, got values {np.unique(a).tolist()}")
    tp = int(np.sum((p == 1) & (t == 1)))
    tn = int(np.sum((p == 0) & (t == 0)))
    fp = int(np.sum((p == 1) & (t == 0)))
    fn = int(np.sum((p == 0) & (t == 1)))
    return tp, tn, fp, fn


def old_f1_score(pred: Sequence[int] | np.ndarray, target: Sequence[int] | np.ndarray) -> float:
    """F1 of the positive class 1: ``2 TP / (2 TP + FP + FN)`` (0 when there are no positives
    predicted or present, as sklearn's ``zero_division=0``)."""
    tp, _, fp, fn = _old_confusion(*_old_pair(pred, target))
    denom = 2 * tp + fp + fn
    return 0.0 if denom == 0 else 2 * tp / denom


def old_matthews_corrcoef(
    pred: Sequence[int] | np.ndarray, target: Sequence[int] | np.ndarray
) -> float:
    """``(TP TN - FP FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN))``; 0 when a factor is 0 (a constant
    prediction or target), as sklearn."""
    tp, tn, fp, fn = _old_confusion(*_old_pair(pred, target))
    denom = math.sqrt(float(tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    return 0.0 if denom == 0 else (tp * tn - fp * fn) / denom


def old_pearson(pred: Sequence[float] | np.ndarray, target: Sequence[float] | np.ndarray) -> float:
    """Pearson's r in float64; ``nan`` when either side is constant (as scipy)."""
    p, t = (a.astype(np.float64) for a in _old_pair(pred, target))
    dp, dt = p - p.mean(), t - t.mean()
    denom = math.sqrt(float(np.sum(dp * dp)) * float(np.sum(dt * dt)))
    return math.nan if denom == 0 else float(np.sum(dp * dt)) / denom


def old_average_ranks(x: Sequence[float] | np.ndarray) -> np.ndarray:
    """1-based ranks of ``x`` with ties given the mean of the ranks they span (scipy "average")."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="stable")
    ranks = np.empty(a.size, dtype=np.float64)
    sorted_a = a[order]
    i = 0
    while i < a.size:
        j = i
        while j + 1 < a.size and sorted_a[j + 1] == sorted_a[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1  # mean of the 1-based ranks i+1 .. j+1
        i = j + 1
    return ranks


def old_spearman(pred: Sequence[float] | np.ndarray, target: Sequence[float] | np.ndarray) -> float:
    """Spearman's rho: Pearson's r of the average ranks (ties share their mean rank)."""
    p, t = _old_pair(pred, target)
    return old_pearson(old_average_ranks(p), old_average_ranks(t))


def test_the_oracle_ranks_ties_by_their_mean() -> None:
    np.testing.assert_array_equal(
        old_average_ranks([10, 20, 10, 30, 20, 20]), [1.5, 4, 1.5, 6, 4, 4]
    )


# ---- library vs oracle on the real dev sets -----------------------------------------------


def _hashed(examples) -> np.ndarray:
    """A fixed pseudo-random 0/1 prediction per example (sha256 of its index and text)."""
    return np.array(
        [
            hashlib.sha256(f"{i}:{ex.text_a}".encode()).digest()[0] & 1
            for i, ex in enumerate(examples)
        ]
    )


def _length_ratio(examples) -> np.ndarray:
    """An STS-B score from sentence lengths: 5 * shorter / longer word count (many ties)."""
    out = []
    for ex in examples:
        a, b = len(ex.text_a.split()), len(ex.text_b.split())
        out.append(5.0 * min(a, b) / max(a, b))
    return np.array(out)


def _predictions(glue: Path, task: str, split: str, rule: str) -> tuple[np.ndarray, np.ndarray]:
    examples = read_glue(task, glue / FOLDERS[task], split)
    target = np.array([ex.label for ex in examples])
    if rule == "majority":
        values, counts = np.unique(target, return_counts=True)
        pred = np.full_like(target, values[np.argmax(counts)])
    elif rule == "hashed":
        pred = _hashed(examples)
    else:
        pred = _length_ratio(examples)
    return pred, target


OLD = {
    "accuracy": old_accuracy,
    "f1": old_f1_score,
    "mcc": old_matthews_corrcoef,
    "pearson": old_pearson,
    "spearman": old_spearman,
}
NEW = {
    "accuracy": accuracy,
    "f1": f1_score,
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}
CASES = [
    ("sst2", "dev", "majority", ("accuracy",)),
    ("sst2", "dev", "hashed", ("accuracy", "f1", "mcc")),
    ("cola", "dev", "majority", ("mcc", "accuracy", "f1")),
    ("cola", "dev", "hashed", ("mcc", "accuracy")),
    ("rte", "dev", "majority", ("accuracy", "f1", "mcc")),
    ("rte", "dev", "hashed", ("accuracy", "mcc")),
    ("mrpc", "dev", "majority", ("f1", "accuracy")),
    ("mrpc", "dev", "hashed", ("f1", "accuracy", "mcc")),
    ("mrpc", "test", "hashed", ("f1", "accuracy")),
    ("stsb", "dev", "length", ("pearson", "spearman")),
]
# Computed once with the old_* functions above (the hand-written metrics as they were).
FIGURES: dict[tuple[str, str, str, str], float] = {
    ("sst2", "dev", "majority", "accuracy"): 0.5091743119266054,
    ("sst2", "dev", "hashed", "accuracy"): 0.5,
    ("sst2", "dev", "hashed", "f1"): 0.5034168564920274,
    ("sst2", "dev", "hashed", "mcc"): 8.418305710408123e-05,
    ("cola", "dev", "majority", "mcc"): 0.0,
    ("cola", "dev", "majority", "accuracy"): 0.6925996204933587,
    ("cola", "dev", "majority", "f1"): 0.8183856502242153,
    ("cola", "dev", "hashed", "mcc"): 0.07036869218466474,
    ("cola", "dev", "hashed", "accuracy"): 0.5218216318785579,
    ("rte", "dev", "majority", "accuracy"): 0.5270758122743683,
    ("rte", "dev", "majority", "f1"): 0.0,
    ("rte", "dev", "majority", "mcc"): 0.0,
    ("rte", "dev", "hashed", "accuracy"): 0.5126353790613718,
    ("rte", "dev", "hashed", "mcc"): 0.020497029939120007,
    ("mrpc", "dev", "majority", "f1"): 0.787518573551263,
    ("mrpc", "dev", "majority", "accuracy"): 0.6495098039215687,
    ("mrpc", "dev", "hashed", "f1"): 0.53125,
    ("mrpc", "dev", "hashed", "accuracy"): 0.4852941176470588,
    ("mrpc", "dev", "hashed", "mcc"): 0.0014430025416720894,
    ("mrpc", "test", "hashed", "f1"): 0.5643363728470111,
    ("mrpc", "test", "hashed", "accuracy"): 0.5014492753623189,
    ("stsb", "dev", "length", "pearson"): 0.06358721584949253,
    ("stsb", "dev", "length", "spearman"): 0.05450434189930854,
}


@pytest.mark.parametrize(("task", "split", "rule", "metrics"), CASES, ids=lambda v: str(v))
def test_library_metrics_equal_the_hand_written_ones_on_real_dev_sets(
    shared_data, task: str, split: str, rule: str, metrics: tuple[str, ...]
) -> None:
    pred, target = _predictions(shared_data("glue"), task, split, rule)
    for m in metrics:
        old, new = OLD[m](pred, target), NEW[m](pred, target)
        want = FIGURES[(task, split, rule, m)]
        assert abs(old - want) <= 1e-12, (task, rule, m, old, want)
        assert abs(new - want) <= 1e-12, (task, rule, m, new, want)
    if split == "dev":
        scored = glue_metrics(task, pred, target)
        for m, v in scored.items():
            assert abs(v - OLD[m](pred, target)) <= 1e-12


def test_compound_split_and_tokenized_bleu_follow_the_papers_script():
    """Issue 23: the WMT En-De papers score tokenized output after splitting hyphenated
    compounds (fairseq's compound_split_bleu.sh: one perl s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g
    pass, matches not overlapping); translation_scores reports that BLEU beside sacreBLEU's."""
    from effiformer.metrics import compound_split, tokenized_bleu, translation_scores

    assert compound_split("Rot-Weiß-Gold") == "Rot ##AT##-##AT## Weiß ##AT##-##AT## Gold"
    assert compound_split("a-b-c, e - f") == "a ##AT##-##AT## b-c, e - f"  # as perl's /g does
    hyp, ref = ["ein rot-weißer Hund läuft ."], ["ein rot-weißer Hund rennt ."]
    tok = tokenized_bleu(hyp, ref)
    plain = translation_scores(hyp, ref)
    assert plain["bleu_tok"] == tok["bleu_tok"] and tok["bleu_tok"] != plain["bleu"]
    assert "compound-split" in tok["bleu_tok_signature"]
    assert tokenized_bleu(ref, ref)["bleu_tok"] == pytest.approx(100.0)
