"""Greedy and beam search for encoder-decoder models, with incremental decoding.

Works with any model that has the incremental interface of
:class:`~effiformer.models.seq2seq.Seq2SeqTransformer`: ``encode(src_ids, src_mask=)``,
``init_decoding_state(enc, rows_per_sentence=)``, ``decode_step(tokens, state)`` and
``reorder_decoding_state(state, index)``, and a config with ``pad_id``, ``bos_id``, ``eos_id``,
``seq_len``. Every step feeds only the newest token; the state carries the rest.

Beam search follows fairseq's ``SequenceGenerator`` (``fairseq/sequence_generator.py``):

- the ``2 * beam`` best continuations of all beams of a sentence are ranked; an EOS among the
  first ``beam`` of them finishes a hypothesis, and the first ``beam`` non-EOS ones continue;
- a finished hypothesis scores ``sum log p / len ** lenpen`` with ``len`` the number of
  generated tokens including EOS (fairseq ``--lenpen``, default 1; 0 = raw log-probability);
  ``lenpen_form="gnmt"`` divides by ``((5 + len) / 6) ** lenpen`` instead (Wu et al. 2016,
  tensor2tensor's ``alpha``: the penalty of Vaswani et al.'s alpha = 0.6);
- PAD and BOS are never generated; EOS is forbidden before ``min_len`` tokens and forced after
  ``max_len = a * src_len + b`` tokens (fairseq ``--max-len-a`` / ``--max-len-b``), capped so the
  decoder input fits ``seq_len``.

Deviations: ``src_len`` is each sentence's own length (real tokens, EOS included) rather than
the padded batch width, so a sentence's translation never depends on its batch mates. Stopping:
fairseq stops a sentence as soon as it has ``beam`` finished hypotheses
(``early_stopping=True`` here); by default a sentence keeps its ``beam`` best finished
hypotheses and goes on until no running beam can beat the worst of them any more: the best a
running hypothesis of log-probability ``s`` (which only falls) can still score is
``s / penalty(L)`` at the longest length ``L`` it may reach when ``lenpen > 0`` (at the
shortest one otherwise). With ``lenpen > 0`` that bound rarely closes before ``max_len``, so
exact stopping costs more steps; validation during training uses ``early_stopping=True``.

Sentences that are done keep their rows in the batch until the whole batch is done (their
results are frozen); batches sorted by length waste little that way.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .recipes import LENPEN_FORMS

__all__ = [
    "length_penalty",
    "Hypothesis",
    "beam_search",
    "greedy_search",
    "max_lengths",
    "score_sequences",
    "translate",
    "encode_sources",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Hypothesis:
    """tokens: generated ids without BOS and EOS; log_prob: sum of the log-probabilities of the
    tokens and the final EOS; score: ``log_prob / length_penalty(len(tokens) + 1, ...)``."""

    tokens: list[int]
    log_prob: float
    score: float


def length_penalty(length: int, lenpen: float, form: str = "fairseq") -> float:
    """What a finished hypothesis of ``length`` generated tokens (EOS included) divides its
    log-probability by: ``length ** lenpen`` (``form="fairseq"``) or ``((5 + length) / 6) **
    lenpen`` (``"gnmt"``). Both rise with ``length`` for ``lenpen > 0``."""
    if form == "gnmt":
        return ((5 + length) / 6) ** lenpen
    return length**lenpen


def _check_lenpen_form(form: str) -> None:
    if form not in LENPEN_FORMS:
        raise ValueError(f"lenpen_form must be one of {list(LENPEN_FORMS)}, got {form!r}")


def _check_src(model: Any, src_ids: Tensor, src_mask: Tensor | None) -> Tensor:
    if not isinstance(src_ids, Tensor) or src_ids.dim() != 2:
        raise ValueError("src_ids must be a (B, S) tensor of token ids")
    mask = src_ids != model.config.pad_id if src_mask is None else src_mask.to(torch.bool)
    return mask


def max_lengths(
    src_lengths: Tensor, *, max_len_a: float, max_len_b: int, seq_len: int, min_len: int = 1
) -> Tensor:
    """Most generated tokens (EOS excluded) per sentence: ``a * src_len + b``, at least
    ``min_len`` and at most ``seq_len - 1`` (BOS plus the tokens must fit the decoder)."""
    if max_len_a < 0 or max_len_b < 0:
        raise ValueError(f"max_len_a and max_len_b must be >= 0, got {max_len_a}, {max_len_b}")
    raw = torch.floor(src_lengths.double() * max_len_a + max_len_b).long()
    return raw.clamp(min=min_len, max=seq_len - 1)


def _mask_specials(lprobs: Tensor, cfg: Any, step: int, min_len: int, limit: Tensor) -> None:
    """In place on (R, V) log-probs: no PAD/BOS, no EOS before ``min_len``, only EOS at
    ``step >= limit`` (R,)."""
    lprobs[:, cfg.pad_id] = -math.inf
    lprobs[:, cfg.bos_id] = -math.inf
    if step < min_len:
        lprobs[:, cfg.eos_id] = -math.inf
    forced = step >= limit
    if bool(forced.any()):
        eos = lprobs[forced, cfg.eos_id].clone()
        lprobs[forced] = -math.inf
        lprobs[forced, cfg.eos_id] = eos


def _score_dtype(logits: Tensor) -> Tensor:
    """Logits in the dtype scores are kept in: float64 for a float64 model (its
    log-probabilities summed without rounding), float32 otherwise (bf16/fp16 logits too)."""
    return logits if logits.dtype == torch.float64 else logits.float()


@torch.inference_mode()
def greedy_search(
    model: Any,
    src_ids: Tensor,
    *,
    src_mask: Tensor | None = None,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    min_len: int = 1,
) -> list[Hypothesis]:
    """The most probable token at every step, one row per sentence. src_ids (B, S) ->
    B hypotheses (score = log_prob: no length normalisation)."""
    cfg = model.config
    mask = _check_src(model, src_ids, src_mask)
    limit = max_lengths(
        mask.sum(1), max_len_a=max_len_a, max_len_b=max_len_b, seq_len=cfg.seq_len, min_len=min_len
    )
    enc = model.encode(src_ids, src_mask=mask)
    state = model.init_decoding_state(enc)
    b = src_ids.shape[0]
    tokens = torch.full((b, 1), cfg.bos_id, dtype=torch.long, device=src_ids.device)
    done = torch.zeros(b, dtype=torch.bool, device=src_ids.device)
    log_prob = torch.zeros(b, dtype=torch.float64, device=src_ids.device)
    out_tokens: list[list[int]] = [[] for _ in range(b)]
    for step in range(int(limit.max()) + 1):
        out = model.decode_step(tokens[:, -1:], state)
        state = out.state
        lprobs = torch.log_softmax(_score_dtype(out.logits[:, -1]), dim=-1)  # (B, V)
        _mask_specials(lprobs, cfg, step, min_len, limit)
        best, tok = lprobs.max(dim=-1)  # (B,)
        log_prob = torch.where(done, log_prob, log_prob + best.double())
        for i in (~done).nonzero().flatten().tolist():
            if int(tok[i]) != cfg.eos_id:
                out_tokens[i].append(int(tok[i]))
        done = done | (tok == cfg.eos_id)
        if bool(done.all()):
            break
        tokens = torch.cat([tokens, tok[:, None]], dim=1)
    return [Hypothesis(out_tokens[i], float(log_prob[i]), float(log_prob[i])) for i in range(b)]


@torch.inference_mode()
def beam_search(
    model: Any,
    src_ids: Tensor,
    *,
    src_mask: Tensor | None = None,
    beam: int = 5,
    lenpen: float = 1.0,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    min_len: int = 1,
    early_stopping: bool = False,
    n_best: int = 1,
    lenpen_form: str = "fairseq",
) -> list[list[Hypothesis]]:
    """Batched beam search (see the module docstring). src_ids (B, S) (EOS-terminated,
    right-padded) -> per sentence its ``n_best`` finished hypotheses, best score first."""
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise ValueError(f"beam must be a positive int, got {beam!r}")
    _check_lenpen_form(lenpen_form)
    if not 1 <= n_best <= beam:
        raise ValueError(f"n_best must be in [1, beam={beam}], got {n_best}")
    if min_len < 0:
        raise ValueError(f"min_len must be >= 0, got {min_len}")
    cfg = model.config
    k = beam
    mask = _check_src(model, src_ids, src_mask)
    dev = src_ids.device
    b = src_ids.shape[0]
    limit_s = max_lengths(
        mask.sum(1), max_len_a=max_len_a, max_len_b=max_len_b, seq_len=cfg.seq_len, min_len=min_len
    )  # (B,)
    limit = limit_s.repeat_interleave(k)  # (R,)
    limits = limit_s.tolist()
    enc = model.encode(src_ids, src_mask=mask)
    state = model.init_decoding_state(enc, rows_per_sentence=k)
    r = b * k
    tokens = torch.full((r, 1), cfg.bos_id, dtype=torch.long, device=dev)  # (R, 1 + step)
    # Only beam 0 of each sentence is live at the start (all beams would be equal).
    scores = torch.full((b, k), -math.inf, dtype=torch.float32, device=dev)
    scores[:, 0] = 0.0
    finished: list[list[Hypothesis]] = [[] for _ in range(b)]
    done = [False] * b
    offsets = (torch.arange(b, device=dev) * k)[:, None]  # (B, 1)
    for step in range(int(limit_s.max()) + 1):
        out = model.decode_step(tokens[:, -1:], state)
        lprobs = torch.log_softmax(_score_dtype(out.logits[:, -1]), dim=-1)  # (R, V)
        scores = scores.to(lprobs.dtype)
        _mask_specials(lprobs, cfg, step, min_len, limit)
        v = lprobs.shape[-1]
        cand = (scores.view(r, 1) + lprobs).view(b, k * v)  # (B, K*V)
        n_cand = min(2 * k, k * v)
        cand_scores, cand_idx = cand.topk(n_cand, dim=1)  # (B, 2K)
        cand_beam, cand_tok = cand_idx // v, cand_idx % v  # (B, 2K)
        is_eos = (cand_tok == cfg.eos_id) & torch.isfinite(cand_scores)
        length = step + 1  # generated tokens including this one
        # Finish hypotheses that end in EOS among each sentence's first K candidates.
        eos_top = is_eos[:, :k]
        if bool(eos_top.any()):
            for bi, ci in eos_top.nonzero().tolist():
                if done[bi]:
                    continue
                row = bi * k + int(cand_beam[bi, ci])
                lp = float(cand_scores[bi, ci])
                hyp = Hypothesis(
                    tokens[row, 1:].tolist(), lp, lp / length_penalty(length, lenpen, lenpen_form)
                )
                _keep(finished[bi], hyp, k)
        # The K best non-EOS candidates continue (EOS ones rank last).
        rank = torch.arange(n_cand, device=dev).expand(b, n_cand)
        rank = torch.where(is_eos, rank + n_cand, rank)
        active = rank.topk(k, dim=1, largest=False).indices  # (B, K)
        new_scores = cand_scores.gather(1, active)  # (B, K)
        new_beam = cand_beam.gather(1, active)
        new_tok = cand_tok.gather(1, active)
        # Sentences whose best running beam can no longer beat their worst kept hypothesis.
        best_running = new_scores.max(dim=1).values.tolist()
        for bi in range(b):
            if done[bi]:
                continue
            if step >= limits[bi]:
                done[bi] = True
            elif len(finished[bi]) == k:
                if early_stopping or not math.isfinite(best_running[bi]):
                    done[bi] = True
                else:
                    longest = limits[bi] + 1
                    reach = longest if lenpen > 0 else length + 1
                    bound = best_running[bi] / length_penalty(reach, lenpen, lenpen_form)
                    done[bi] = bound <= min(h.score for h in finished[bi])
        if all(done):
            break
        index = (new_beam + offsets).view(-1)  # (R,) rows to continue from
        tokens = torch.cat([tokens.index_select(0, index), new_tok.view(r, 1)], dim=1)
        scores = new_scores
        state = model.reorder_decoding_state(out.state, index)
    return [sorted(f, key=lambda h: h.score, reverse=True)[:n_best] for f in finished]


def _keep(pool: list[Hypothesis], hyp: Hypothesis, k: int) -> None:
    """Add ``hyp`` to ``pool``, keeping the ``k`` best by score."""
    if len(pool) < k:
        pool.append(hyp)
        return
    worst = min(range(len(pool)), key=lambda i: pool[i].score)
    if hyp.score > pool[worst].score:
        pool[worst] = hyp


@torch.inference_mode()
def score_sequences(
    model: Any, src_ids: Tensor, hyps: Sequence[Sequence[int]], *, src_mask: Tensor | None = None
) -> list[float]:
    """Sum of log-probabilities the model gives each ``hyps[i]`` (ids without BOS/EOS) followed
    by EOS, for source row ``i``, by teacher forcing."""
    cfg = model.config
    if len(hyps) != src_ids.shape[0]:
        raise ValueError(f"one hypothesis per source row ({src_ids.shape[0]}), got {len(hyps)}")
    t = max(len(h) for h in hyps) + 1
    tgt = torch.full((len(hyps), t), cfg.pad_id, dtype=torch.long, device=src_ids.device)
    for i, h in enumerate(hyps):
        tgt[i, : len(h) + 1] = torch.tensor([*h, cfg.eos_id], dtype=torch.long)
    tgt_in = torch.cat([torch.full_like(tgt[:, :1], cfg.bos_id), tgt[:, :-1]], dim=1)
    was_training = model.training
    model.eval()
    try:
        out = model(src_ids, tgt_in, src_mask=src_mask)
    finally:
        model.train(was_training)
    lprobs = torch.log_softmax(out.logits.double(), dim=-1)  # (B, T, V)
    picked = lprobs.gather(-1, tgt[..., None]).squeeze(-1)  # (B, T)
    keep = tgt != cfg.pad_id
    return (picked * keep).sum(1).tolist()


def encode_sources(
    tokenizer: Any, texts: Sequence[str], *, eos_id: int, max_tokens: int
) -> tuple[list[list[int]], int]:
    """Subword ids of each text followed by EOS, truncated to ``max_tokens`` (EOS kept), and how
    many texts were truncated."""
    ids = tokenizer.encode_ids(list(texts)) if texts else []
    out, cut = [], 0
    for row in ids:
        if len(row) + 1 > max_tokens:
            row = row[: max_tokens - 1]
            cut += 1
        out.append([*row, eos_id])
    return out, cut


def translate(
    model: Any,
    sources: Sequence[str] | Sequence[Sequence[int]] | Tensor,
    *,
    tokenizer: Any = None,
    beam: int = 5,
    lenpen: float = 1.0,
    max_len_a: float = 1.2,
    max_len_b: int = 10,
    batch_size: int = 64,
    early_stopping: bool = False,
    progress: Callable[[int], None] | None = None,
    lenpen_form: str = "fairseq",
) -> list[str] | list[list[int]]:
    """Translate strings (needs ``tokenizer``) or id sequences (each ending in EOS; a (B, S)
    tensor is read row by row up to its padding), in batches of ``batch_size`` sentences sorted
    by length; results come back in input order. ``beam=1``: greedy search. Sources longer than
    the model's ``seq_len`` are truncated with a warning; an empty string translates to an empty
    string (the line is kept, so outputs stay aligned with inputs). ``progress(n)`` is called
    after each batch with the number of sentences done."""
    cfg = model.config
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    _check_lenpen_form(lenpen_form)
    as_text = (
        len(sources) > 0 and isinstance(sources[0], str)
        if not isinstance(sources, Tensor)
        else False
    )
    if as_text:
        if tokenizer is None:
            raise ValueError("translating strings needs the tokenizer (tokenizer=...)")
        texts = list(sources)
        empty = [i for i, s in enumerate(texts) if not s.strip()]
        ids, cut = encode_sources(tokenizer, texts, eos_id=cfg.eos_id, max_tokens=cfg.seq_len)
        if cut:
            logger.warning(
                "%d of %d sources are longer than the model's limit (seq_len=%d tokens with EOS) "
                "and were truncated",
                cut,
                len(texts),
                cfg.seq_len,
            )
    else:
        if isinstance(sources, Tensor):
            rows = [r[r != cfg.pad_id].tolist() for r in sources]
        else:
            rows = [list(map(int, r)) for r in sources]
        ids, empty = [], []
        for i, r in enumerate(rows):
            if not r or r[-1] != cfg.eos_id:
                r = [*r, cfg.eos_id]
            if len(r) > cfg.seq_len:
                logger.warning(
                    "source %d has %d tokens > seq_len=%d: truncated", i, len(r), cfg.seq_len
                )
                r = [*r[: cfg.seq_len - 1], cfg.eos_id]
            if r == [cfg.eos_id]:
                empty.append(i)
            ids.append(r)
    empty_set = set(empty)
    order = sorted((i for i in range(len(ids)) if i not in empty_set), key=lambda i: len(ids[i]))
    results: list[list[int]] = [[] for _ in ids]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    done = len(empty)
    try:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            width = max(len(ids[i]) for i in chunk)
            src = torch.full((len(chunk), width), cfg.pad_id, dtype=torch.long)
            for j, i in enumerate(chunk):
                src[j, : len(ids[i])] = torch.tensor(ids[i])
            src = src.to(device)
            kw = dict(max_len_a=max_len_a, max_len_b=max_len_b)
            if beam == 1:
                hyps = [h.tokens for h in greedy_search(model, src, **kw)]
            else:
                found = beam_search(
                    model,
                    src,
                    beam=beam,
                    lenpen=lenpen,
                    lenpen_form=lenpen_form,
                    early_stopping=early_stopping,
                    **kw,
                )
                hyps = [f[0].tokens for f in found]
            for i, h in zip(chunk, hyps):
                results[i] = h
            done += len(chunk)
            if progress is not None:
                progress(done)
    finally:
        model.train(was_training)
    if as_text:
        return ["" if i in empty_set else tokenizer.decode(r) for i, r in enumerate(results)]
    return results
