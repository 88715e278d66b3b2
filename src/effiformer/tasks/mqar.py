"""Multi-query associative recall, MQAR (Arora et al. 2023, "Zoology: Measuring and Improving
Recall in Efficient Language Models", arXiv 2312.04927, sec. 3 and its ``multiquery_ar``
generator).

A sequence of ``seq_len`` tokens starts with ``n_pairs`` key-value pairs ``k1 v1 k2 v2 ...``
(keys drawn without replacement from ``1 .. vocab_size/2 - 1``, values without replacement from
``vocab_size/2 .. vocab_size - 1``); the rest of the sequence holds every key once more, as a
query, at even offsets ``2 n_pairs + 2 g`` after the pairs, where the gaps ``g`` are drawn without
replacement with probability proportional to ``g^(a - 1)`` (``a = power_a = 0.01``, Zoology's
default: most queries come soon after the pairs, a few far). A causal model reads the sequence and
must predict, at each query, the value that followed that key among the pairs; every other
position is filled with uniform random tokens (Zoology's ``random_non_queries``) and is not scored
(target ``-100``). Accuracy is over the queried values only.

The number of pairs grows with the length, ``n_pairs = seq_len / 16`` by default (4 at 64, 8 at
128, 16 at 256, 32 at 512, 64 at 1,024), as Zoology's sweep pairs longer sequences with more
pairs. Deviations from Zoology, each for the CPU budget: the vocabulary defaults to 256 (Zoology:
8,192: with 4,096 values each is a target about once in 32 steps of 128 queries, and the
embeddings alone take thousands of steps to learn); sequences are exactly ``seq_len`` tokens
(Zoology draws ``seq_len + 1`` and shifts); and the random fill never holds one of the row's
keys (``fill_keys=False``; Zoology's fill may). With 8,192 tokens that changes little (0.03
earlier random copies of a queried key per query at 1,024 tokens, measured), but with 256 a
1,024-token sequence holds 0.73 random copies per query, each followed by a random token: a
lookup of "the token after the earlier occurrence of this key" is then ambiguous, which is not
what the task measures. Without key copies, each key occurs exactly twice, in its pair and as
its query, as in Zoology at its own vocabulary.

**Training lengths** (``train_min_len``): as Zoology trains one model on several
(length, pairs) configurations (for example 64/4, 128/8, 256/16 together), a task may train on
the ladder of lengths ``train_min_len, 2 train_min_len, ..., seq_len``, with pairs scaled to each
(``T/16`` by default): training step ``i`` draws its batch at the ladder's ``i mod n``-th length
with ``batch_size * seq_len / length`` rows, so every step holds the same number of tokens;
evaluation stays at ``seq_len``. A model that forms its recall circuit on the short sequences
carries it to the long ones if its mechanism can reach that far.

The answer of every query is recoverable from the sequence alone (:func:`mqar_answers`), which
the tests check. Data is a pure function of the seed (:class:`~.synthetic.SyntheticTask`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..models.base import IGNORE_INDEX
from .registry import BuildContext, TaskSetup, register_task, task_option
from .synthetic import SyntheticTask, build_token_model, check_int, derive_seed

__all__ = [
    "MQAROptions",
    "MQARTask",
    "build_mqar",
    "default_pairs",
    "length_ladder",
    "mqar_answers",
    "mqar_recall_positions",
    "mqar_batch",
]


def default_pairs(seq_len: int) -> int:
    """Key-value pairs for a sequence of ``seq_len`` tokens: ``seq_len // 16`` (at least 1)."""
    return max(1, seq_len // 16)


def length_ladder(lo: int | None, seq_len: int) -> tuple[int, ...]:
    """``(lo, 2 lo, 4 lo, ..., seq_len)``, or ``(seq_len,)`` for ``lo=None``; ``seq_len / lo``
    must be a power of two."""
    if lo is None:
        return (seq_len,)
    lo = check_int("train_min_len", lo, 4)
    ratio = seq_len // lo
    if lo > seq_len or seq_len % lo or ratio & (ratio - 1):
        raise ValueError(
            f"train_min_len={lo} must be seq_len={seq_len} divided by a power of two "
            f"(for example {seq_len // 4} or {seq_len // 16})"
        )
    out, t = [], lo
    while t <= seq_len:
        out.append(t)
        t *= 2
    return tuple(out)


def mqar_batch(
    rows: int,
    seq_len: int,
    n_pairs: int,
    vocab_size: int,
    generator: torch.Generator,
    *,
    power_a: float = 0.01,
    fill_keys: bool = False,
) -> tuple[Tensor, Tensor]:
    """``rows`` MQAR sequences as ``(input_ids, targets)``, each ``(rows, seq_len)``: targets are
    ``-100`` except at query positions, where they hold the queried key's value. ``fill_keys``:
    whether the random fill may hold the row's keys (Zoology's; off by default, see the module
    docstring)."""
    half = vocab_size // 2
    if n_pairs > half - 1:
        raise ValueError(
            f"{n_pairs} key-value pairs need {n_pairs} distinct keys, but vocab_size={vocab_size} "
            f"has {half - 1} (1 .. vocab_size/2 - 1); raise vocab_size or lower the pairs"
        )
    context = 2 * n_pairs
    space = (seq_len - context) // 2
    if space < n_pairs:
        raise ValueError(
            f"seq_len={seq_len} cannot hold {n_pairs} pairs and {n_pairs} queries (needs "
            f"seq_len >= {4 * n_pairs})"
        )
    # on the generator's device whatever the default device is (a model built on "meta" too)
    with torch.device(generator.device):
        # keys and values without replacement per row: the first n of a random permutation
        keys = torch.rand(rows, half - 1, generator=generator).argsort(1)[:, :n_pairs] + 1
        values = torch.rand(rows, vocab_size - half, generator=generator).argsort(1)[:, :n_pairs]
        values = values + half
        x = torch.randint(0, vocab_size, (rows, seq_len), generator=generator)
        if not fill_keys:  # redraw fill tokens that are one of the row's keys until none is
            is_key = torch.zeros(rows, vocab_size, dtype=torch.bool)
            is_key.scatter_(1, keys, True)
            hit = is_key.gather(1, x)
            while hit.any():
                x[hit] = torch.randint(0, vocab_size, (int(hit.sum()),), generator=generator)
                hit = is_key.gather(1, x)
        x[:, 0:context:2] = keys
        x[:, 1:context:2] = values
        # query gaps: without replacement, p(g) ~ (g + 1)^(a - 1), g = 0 .. space - 1
        p = power_a * torch.arange(1, space + 1, dtype=torch.float64) ** (power_a - 1)
        gaps = torch.multinomial(
            p.expand(rows, space), n_pairs, replacement=False, generator=generator
        )
        qpos = context + 2 * gaps  # (rows, n_pairs)
        x.scatter_(1, qpos, keys)
        y = torch.full((rows, seq_len), IGNORE_INDEX, dtype=torch.long)
        y.scatter_(1, qpos, values)
        return x, y


def mqar_answers(input_ids: Tensor, n_pairs: int) -> Tensor:
    """What a perfect recall gives at every position of ``input_ids`` ``(rows, T)``: the value
    that followed the token among the first ``n_pairs`` pairs, where the token is one of those
    keys and the position lies after the pairs; ``-100`` elsewhere. On MQAR data this equals the
    targets at every query position (an independent check of the generator)."""
    rows, t = input_ids.shape
    context = 2 * n_pairs
    out = torch.full_like(input_ids, IGNORE_INDEX)
    for r in range(rows):
        table = {int(input_ids[r, 2 * i]): int(input_ids[r, 2 * i + 1]) for i in range(n_pairs)}
        for pos in range(context, t):
            tok = int(input_ids[r, pos])
            if tok in table:
                out[r, pos] = table[tok]
    return out


def mqar_recall_positions(
    input_ids: Tensor, targets: Tensor, n_pairs: int
) -> list[list[tuple[int, int]]]:
    """Per row of ``input_ids`` ``(rows, T)``, the ``(query position, value position)`` of every
    scored query (``targets != -100``): where a recall head must look. The value sits right
    after the first of the ``n_pairs`` keys equal to the query token."""
    out = []
    for r in range(input_ids.shape[0]):
        keys = input_ids[r, 0 : 2 * n_pairs : 2].tolist()
        out.append([(q, 2 * keys.index(int(input_ids[r, q])) + 1)
                    for q in (targets[r] != IGNORE_INDEX).nonzero().flatten().tolist()])  # fmt: skip
    return out


class MQARTask(SyntheticTask):
    """The MQAR task (see the module docstring).

    ``seq_len``: tokens per sequence (the model reads all of them); ``n_pairs``: key-value pairs
    (None: ``seq_len // 16``); ``vocab_size``: keys are ``1 .. vocab_size/2 - 1``, values the
    upper half; ``power_a``: the query-gap power law; ``train_min_len``: the shortest length of
    the training ladder (``seq_len / train_min_len`` a power of two; None: ``seq_len`` only; see
    the module docstring), with ``n_pairs`` scaled to each length; the rest as
    :class:`~.synthetic.SyntheticTask`.
    """

    name = "mqar"

    def __init__(
        self,
        *,
        seq_len: int = 256,
        n_pairs: int | None = None,
        vocab_size: int = 256,
        power_a: float = 0.01,
        train_min_len: int | None = None,
        batch_size: int = 32,
        seed: int = 0,
        eval_sequences: int = 512,
        eval_batch_size: int = 64,
        eval_seed: int = 0,
    ) -> None:
        super().__init__(
            batch_size=batch_size,
            seed=seed,
            eval_sequences=eval_sequences,
            eval_batch_size=eval_batch_size,
            eval_seed=eval_seed,
        )
        self.seq_len = check_int("seq_len", seq_len, 4)
        self._vocab = check_int("vocab_size", vocab_size, 6)
        self.n_pairs = default_pairs(seq_len) if n_pairs is None else check_int("n_pairs", n_pairs)
        if not (isinstance(power_a, int | float) and 0 < power_a <= 1):
            raise ValueError(f"power_a must be in (0, 1], got {power_a!r}")
        self.power_a = float(power_a)
        self.model_len = self.seq_len
        self.train_min_len = train_min_len
        self.train_lengths = length_ladder(train_min_len, self.seq_len)
        # validate every combination once, with the error the generator gives
        for t in self.train_lengths:
            mqar_batch(1, t, self._pairs_at(t), self._vocab, torch.Generator().manual_seed(0))

    def _pairs_at(self, length: int) -> int:
        """Key-value pairs of a sequence of ``length`` tokens: ``n_pairs`` scaled by
        ``length / seq_len`` (``length / 16`` by default)."""
        return max(1, self.n_pairs * length // self.seq_len)

    def batch(self, step: int) -> tuple[Tensor, Tensor]:
        """Training batch ``step``: at ``train_lengths[step % n]``, ``batch_size * seq_len /
        length`` rows (the same tokens at every step)."""
        length = self.train_lengths[step % len(self.train_lengths)]
        if length == self.seq_len:
            return super().batch(step)
        g = torch.Generator().manual_seed(derive_seed(self.seed, step))
        rows = self.batch_size * (self.seq_len // length)
        return mqar_batch(
            rows, length, self._pairs_at(length), self._vocab, g, power_a=self.power_a
        )

    @property
    def vocab_size(self) -> int:
        return self._vocab

    def generate(self, rows: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return mqar_batch(
            rows, self.seq_len, self.n_pairs, self._vocab, generator, power_a=self.power_a
        )

    def _settings(self) -> dict[str, Any]:
        return {
            "seq_len": self.seq_len,
            "n_pairs": self.n_pairs,
            "vocab_size": self._vocab,
            "power_a": self.power_a,
            **({"train_min_len": self.train_min_len} if len(self.train_lengths) > 1 else {}),
            "batch_size": self.batch_size,
            "seed": self.seed,
        }

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "chance_accuracy": 1.0 / (self._vocab - self._vocab // 2)}

    def __repr__(self) -> str:
        return (
            f"MQARTask(seq_len={self.seq_len}, n_pairs={self.n_pairs}, "
            f"vocab_size={self._vocab}, batch_size={self.batch_size}, seed={self.seed})"
        )


@dataclass(frozen=True, kw_only=True)
class MQAROptions:
    """``effiformer train NAME --task mqar`` options."""

    seq_len: int = task_option(256, "tokens per sequence")
    n_pairs: int | None = task_option(None, "key-value pairs (default: seq_len / 16)")
    vocab: int = task_option(256, "vocabulary: keys below vocab/2, values above", flag="--vocab")
    power_a: float = task_option(0.01, "query-gap power law (Zoology's a)")
    train_min_len: int | None = task_option(
        None, "train on every length from this, doubling, up to seq-len (Zoology's mixture)"
    )
    batch: int = task_option(32, "sequences per global batch")
    eval_sequences: int = task_option(512, "sequences in each evaluation set")

    def __post_init__(self) -> None:
        MQARTask(
            seq_len=self.seq_len,
            n_pairs=self.n_pairs,
            vocab_size=self.vocab,
            power_a=self.power_a,
            train_min_len=self.train_min_len,
            batch_size=self.batch,
            eval_sequences=self.eval_sequences,
        )  # validates the combination, naming the field


def build_mqar(options: MQAROptions, context: BuildContext) -> TaskSetup:
    """The ``mqar`` task: a causal model of the registered NAME with ``vocab_size`` and
    ``seq_len`` set for the task, and the :class:`MQARTask`."""
    task = MQARTask(
        seq_len=options.seq_len,
        n_pairs=options.n_pairs,
        vocab_size=options.vocab,
        power_a=options.power_a,
        train_min_len=options.train_min_len,
        batch_size=options.batch,
        seed=context.seed,
        eval_sequences=options.eval_sequences,
    )
    model, name = build_token_model(
        context, vocab_size=options.vocab, seq_len=options.seq_len, task="mqar"
    )
    task.check_model(model)
    return TaskSetup(task=task, model=model, model_name=name, data_name=task.fingerprint())


register_task(
    "mqar",
    MQAROptions,
    build_mqar,
    description="multi-query associative recall (Zoology), generated from the seed",
)
