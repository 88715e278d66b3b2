"""Corpus-level translation metrics from sacreBLEU (Post 2018, arXiv 1804.08771).

:func:`translation_scores` scores detokenized hypotheses against one reference per sentence
with sacreBLEU's defaults (BLEU: 13a tokenization, mixed case, exponential smoothing; chrF:
character 6-grams, beta 2) and returns the signatures, so a published figure says exactly how it
was computed.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["translation_scores"]


def translation_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict:
    """``{"bleu", "chrf", "bleu_signature", "chrf_signature"}`` of ``hypotheses`` against
    ``references`` (one per hypothesis, detokenized text)."""
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
    }
