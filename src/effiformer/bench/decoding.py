"""Decoding latency of an encoder-decoder model, measured the way HAT measures it.

HAT (Wang et al. 2020, arXiv 2005.14187, sec. 3.2 and ``mit-han-lab/hardware-aware-transformers``
``latency_dataset.py``): one dummy sentence of ``N`` source tokens, batch 1, beam ``B``; the
encoder runs once and the decoder runs autoregressively for ``N`` steps with its incremental
state (here: beam search with EOS forbidden until step ``N`` and forced there, so exactly ``N``
decoder steps run whatever the weights); 5 warm-up runs, then ``runs`` timed runs, and the mean
of the 10-90 % trimmed range. The model is in eval mode under ``torch.inference_mode``;
``threads`` pins torch's intra-op threads for the measurement (and restores them after).

:func:`decoding_latency` returns the encoder and decoder times separately (HAT's predictor
target is their sum), so latency predictors and the SuperTransformer search measure through
this one function.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["DecodingLatency", "decoding_latency", "trimmed_mean", "trimmed_std"]


def _trimmed(values: list[float], lo: float, hi: float) -> list[float]:
    if not values:
        raise ValueError("no values")
    v = sorted(values)
    a, b = int(len(v) * lo), max(int(len(v) * hi), int(len(v) * lo) + 1)
    return v[a:b]


def trimmed_mean(values: list[float], lo: float = 0.1, hi: float = 0.9) -> float:
    """Mean of the sorted values between the ``lo`` and ``hi`` fractions (HAT: 10-90 %)."""
    return statistics.fmean(_trimmed(values, lo, hi))


def trimmed_std(values: list[float], lo: float = 0.1, hi: float = 0.9) -> float:
    """Population standard deviation of the same trimmed range (HAT's ``np.std``)."""
    return statistics.pstdev(_trimmed(values, lo, hi))


@dataclass(frozen=True)
class DecodingLatency:
    """Seconds per sentence (trimmed means): encoder, decoder (``steps`` steps of beam search)
    and their sum; ``runs``: the timed runs, ``raw``: each run's total; ``encoder_std_s`` /
    ``decoder_std_s``: the trimmed runs' spreads; ``threads``: the intra-op threads used."""

    encoder_s: float
    decoder_s: float
    total_s: float
    src_len: int
    steps: int
    beam: int
    runs: int
    raw: tuple[float, ...]
    encoder_std_s: float = 0.0
    decoder_std_s: float = 0.0
    threads: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def decoding_latency(
    model: Any,
    *,
    src_len: int = 30,
    beam: int = 5,
    steps: int | None = None,
    warmup: int = 5,
    runs: int = 20,
    seed: int = 0,
    threads: int | None = None,
) -> DecodingLatency:
    """Latency of translating one sentence of ``src_len`` tokens with beam ``beam`` for
    ``steps`` decoder steps (default ``src_len``), as HAT measures it (module docstring).
    ``threads``: torch intra-op threads during the measurement (None: as they are)."""
    from ..generation import beam_search

    if threads is not None and (isinstance(threads, bool) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    if runs < 1 or warmup < 0:
        raise ValueError(f"runs must be >= 1 and warmup >= 0, got {runs}, {warmup}")

    cfg = model.config
    steps = src_len if steps is None else steps
    if not 1 <= steps <= cfg.seq_len - 1 or not 1 <= src_len <= cfg.seq_len:
        raise ValueError(
            f"src_len={src_len} and steps={steps} must fit the model's seq_len={cfg.seq_len}"
        )
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    g = torch.Generator().manual_seed(seed)
    specials = max(cfg.pad_id, cfg.bos_id, cfg.eos_id) + 1
    src = torch.randint(specials, cfg.vocab_size, (1, src_len), generator=g)
    src[0, -1] = cfg.eos_id
    src = src.to(device)
    enc_t, dec_t = [], []
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        for i in range(warmup + runs):
            _sync(device)
            t0 = time.perf_counter()
            model.encode(src)
            _sync(device)
            t1 = time.perf_counter()
            # Exactly `steps` decoder steps: EOS is forbidden before and forced at the last.
            beam_search(
                model, src, beam=beam, max_len_a=0, max_len_b=steps - 1, min_len=steps - 1,
                early_stopping=True,
            )  # fmt: skip
            _sync(device)
            t2 = time.perf_counter()
            if i >= warmup:
                enc_t.append(t1 - t0)
                dec_t.append(t2 - t1)  # includes beam_search's own encoder pass, see below
    finally:
        model.train(was_training)
        torch.set_num_threads(old_threads)
    enc = trimmed_mean(enc_t)
    # beam_search encodes the sentence itself: each run's decoder time is its search less its
    # own encoder pass, so the decoder's mean and spread are of the same per-run figures
    dec_only = [max(d - e, 0.0) for d, e in zip(dec_t, enc_t)]
    dec = trimmed_mean(dec_only)
    totals = tuple(d for d in dec_t)
    return DecodingLatency(
        encoder_s=enc,
        decoder_s=dec,
        total_s=trimmed_mean(dec_t),
        src_len=src_len,
        steps=steps,
        beam=beam,
        runs=runs,
        raw=totals,
        encoder_std_s=trimmed_std(enc_t),
        decoder_std_s=trimmed_std(dec_only),
        threads=threads if threads is not None else old_threads,
    )
