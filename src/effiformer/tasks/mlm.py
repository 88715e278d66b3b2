"""Masked-LM (BERT) and ELECTRA pretraining on subword windows of any text corpus.

Masking follows BERT (Devlin et al. 2019, arXiv 1810.04805, sec. 3.1 and appendix A.1): each
non-special token is selected with probability ``mask_prob`` (15%) independently; a selected token
is replaced by ``[MASK]`` with probability 0.8, by a random token with probability 0.1, and kept
with probability 0.1; the targets are the original ids at selected positions and -100 elsewhere.
Special tokens (``[PAD] [UNK] [CLS] [SEP] [MASK]``) are never selected. Deliberate deviations:
random replacements are drawn from the non-special ids only (HF's collator draws from the whole
vocabulary); a batch in which no token was selected gets the first maskable token of each row
selected, so the loss is never 0/0.

Each masking draws from an explicit ``torch.Generator`` seeded by a hash of
``(seed, epoch, batch index)`` (training) or ``(seed, "eval", window)`` (evaluation), so the same
seed gives the same masks, a resumed run sees the masks an uninterrupted one would, and the
validation masks are the same for every evaluation.

Data: the text is tokenized by a :class:`~effiformer.data.tokenizer.SubwordTokenizer` (trained on
the training split when none is given) into one id stream per split; training rows are
non-overlapping windows of ``seq_len - 2`` subwords in a shuffled order
(:class:`~effiformer.data.WindowBatcher`), each wrapped as ``[CLS] window [SEP]``. Evaluation
walks the split as consecutive windows (the last one padded) with fixed masks and reports the
MLM loss (mean nats per masked token) and accuracy. Any :class:`~effiformer.data.Corpus` works:
byte and char corpora are decoded back to text, word corpora are joined with spaces and their
``<unk>`` becomes ``[UNK]``; :func:`read_texts` reads raw text files or folders.

ELECTRA (Clark et al. 2020, arXiv 2003.10555, sec. 2): the same data and masks; the model is a
generator + discriminator pair whose forward returns the generator's MLM loss plus ``50 x`` the
discriminator's replaced-token loss (the paper's lambda = 50). This task hands it the masked ids,
the MLM targets and an explicit generator for sampling the replacements, and reports both losses.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from ..checkpoint import load_checkpoint, load_config, load_weights
from ..config import ModelConfig, parse_overrides, replace_config
from ..data import FORMATS, Corpus, WindowBatcher, load_corpus
from ..data.tokenizer import CLS_TOKEN_TYPE_ID, MASK_ID, PAD_ID, SPECIAL_TOKENS, SubwordTokenizer
from ..models.base import IGNORE_INDEX, ModelOutput
from ..progress import status, track
from ..registry import build_model, get_config, get_spec
from .base import Batch, rank_rows, restore_position
from .registry import BuildContext, TaskSetup, register_task, task_option

__all__ = [
    "ElectraOptions",
    "MLMOptions",
    "MLMTask",
    "build_mlm",
    "electra_generator_config",
    "mask_tokens",
    "read_texts",
    "tokenize_stream",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]
N_SPECIAL = len(SPECIAL_TOKENS)
ELECTRA_DISC_WEIGHT = 50.0


def mask_tokens(
    input_ids: Tensor,
    *,
    vocab_size: int,
    generator: torch.Generator,
    mask_prob: float = 0.15,
    mask_id: int = MASK_ID,
    n_special: int = N_SPECIAL,
) -> tuple[Tensor, Tensor]:
    """BERT masking of ``input_ids`` (B, T) -> ``(masked_ids (B, T), targets (B, T))``.

    Ids below ``n_special`` (the special tokens) are never selected. ``targets`` holds the
    original id at selected positions and -100 elsewhere. Draws, in this order, from
    ``generator``: the selection uniforms, the 80/10/10 uniforms, the random replacement ids.
    """
    if input_ids.dim() != 2 or input_ids.dtype != torch.int64:
        raise ValueError(
            f"input_ids must be (batch, seq_len) int64, got {tuple(input_ids.shape)} "
            f"{input_ids.dtype}"
        )
    if not 0.0 < mask_prob < 1.0:
        raise ValueError(f"mask_prob must be in (0, 1), got {mask_prob!r}")
    if vocab_size <= n_special:
        raise ValueError(f"vocab_size={vocab_size} leaves no non-special ids to sample from")
    shape = input_ids.shape
    maskable = input_ids >= n_special  # (B, T)
    selected = (torch.rand(shape, generator=generator) < mask_prob) & maskable
    if not selected.any() and maskable.any():
        first = maskable.long().argmax(dim=1)  # (B,) first maskable position of each row
        rows = maskable.any(dim=1)
        selected[rows.nonzero().squeeze(1), first[rows]] = True
    action = torch.rand(shape, generator=generator)  # (B, T)
    random_ids = torch.randint(n_special, vocab_size, shape, generator=generator)
    to_mask = selected & (action < 0.8)
    to_random = selected & (action >= 0.8) & (action < 0.9)
    masked = torch.where(to_mask, torch.full_like(input_ids, mask_id), input_ids)
    masked = torch.where(to_random, random_ids, masked)
    targets = torch.where(selected, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    return masked, targets


def _generator(*parts: object) -> torch.Generator:
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def _device_generator(cpu_gen: torch.Generator, device: torch.device) -> torch.Generator:
    """A generator on ``device`` seeded from ``cpu_gen`` (multinomial samples on the device)."""
    seed = int(torch.randint(0, 2**62, (1,), generator=cpu_gen))
    return torch.Generator(device=device).manual_seed(seed)


# ------------------------------------------------------------------------------------------------
# Text
# ------------------------------------------------------------------------------------------------


def read_texts(path: PathLike) -> list[str]:
    """Non-empty lines of a UTF-8 text file, or of every file of a folder (recursive, sorted by
    relative path, hidden entries skipped). Raises ``FileNotFoundError``/``ValueError`` naming
    the path."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    files = (
        [p]
        if p.is_file()
        else sorted(
            (
                f
                for f in p.rglob("*")
                if f.is_file() and not any(s.startswith(".") for s in f.relative_to(p).parts)
            ),
            key=lambda f: f.relative_to(p).as_posix(),
        )
    )
    lines: list[str] = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"{f}: not UTF-8 text (invalid byte at offset {e.start})") from None
        lines.extend(line for line in text.splitlines() if line.strip())
    if not lines:
        raise ValueError(f"{p}: holds no text")
    return lines


def corpus_texts(corpus: Corpus, split: str) -> list[str]:
    """The non-empty lines of a corpus split as text (word corpora: ``<unk>`` -> ``[UNK]``)."""
    text = corpus.vocab.decode(corpus.split(split))
    lines = text.split("\n")
    if corpus.unit == "word" and corpus.vocab.unk is not None:
        unk = corpus.vocab.unk
        lines = [" ".join("[UNK]" if w == unk else w for w in line.split()) for line in lines]
    return [line for line in lines if line.strip()]


def tokenize_stream(tokenizer: SubwordTokenizer, texts: Sequence[str]) -> Tensor:
    """The subword ids of ``texts`` concatenated into one stream, shape ``(N,)`` int64."""
    ids: list[int] = []
    chunk = 4096
    for i in range(0, len(texts), chunk):
        for row in tokenizer.encode_ids(list(texts[i : i + chunk])):
            ids.extend(row)
    out = torch.tensor(ids, dtype=torch.int64)
    return out[out != PAD_ID]  # a literal "[PAD]" in the text would read as padding


def _model_accepts(model: nn.Module, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


# ------------------------------------------------------------------------------------------------
# Task
# ------------------------------------------------------------------------------------------------


class MLMTask:
    """Masked-LM (``objective="mlm"``) or ELECTRA (``objective="electra"``) pretraining.

    ``train_ids`` / ``valid_ids``: subword id streams (N,) from ``tokenizer``; build them with
    :meth:`from_texts` or :meth:`from_corpus`. ``batch_size``: rows per optimiser step;
    ``seq_len``: tokens per row including ``[CLS]`` and ``[SEP]``; ``seed``: window order and
    masks; ``eval_windows``: evaluate on only the first N windows of a split (None: all).

    Model call: ``model(masked_ids, targets=..., attention_mask=...)`` plus
    ``token_type_ids=`` when the model's ``forward`` takes it (Funnel: ``[CLS]`` has type 2) and,
    for ELECTRA, ``generator=`` (the explicit sampling generator of this batch).
    """

    def __init__(
        self,
        train_ids: Tensor,
        valid_ids: Tensor,
        tokenizer: SubwordTokenizer,
        *,
        test_ids: Tensor | None = None,
        objective: Literal["mlm", "electra"] = "mlm",
        batch_size: int = 16,
        seq_len: int = 128,
        seed: int = 0,
        mask_prob: float = 0.15,
        eval_batch_size: int = 16,
        eval_windows: int | None = None,
        name: str = "text",
        source_fingerprint: str = "",
        data_spec: dict[str, Any] | None = None,
    ) -> None:
        if not isinstance(tokenizer, SubwordTokenizer):
            raise TypeError(f"tokenizer must be a SubwordTokenizer, got {type(tokenizer).__name__}")
        if objective not in ("mlm", "electra"):
            raise ValueError(f"objective must be 'mlm' or 'electra', got {objective!r}")
        self.tokenizer = tokenizer
        self.objective = objective
        self.batch_size = _positive_int("batch_size", batch_size)
        self.seq_len = _positive_int("seq_len", seq_len)
        if self.seq_len < 3:
            raise ValueError(f"seq_len must be >= 3 ([CLS], a token, [SEP]), got {seq_len}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.seed = seed
        if not 0.0 < mask_prob < 1.0:
            raise ValueError(f"mask_prob must be in (0, 1), got {mask_prob!r}")
        self.mask_prob = mask_prob
        self.eval_batch_size = _positive_int("eval_batch_size", eval_batch_size)
        if eval_windows is not None:
            _positive_int("eval_windows", eval_windows)
        self.eval_windows = eval_windows
        self.name = name
        self.data_spec = data_spec
        self.splits: dict[str, Tensor] = {"train": train_ids, "valid": valid_ids}
        if test_ids is not None:
            self.splits["test"] = test_ids
        for split, ids in self.splits.items():
            if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype != torch.int64:
                raise ValueError(f"{split}_ids must be a 1-D int64 tensor")
            if ids.numel() == 0:
                raise ValueError(f"the {split} split of {name!r} has no tokens")
            if int(ids.min()) < 0 or int(ids.max()) >= tokenizer.vocab_size:
                raise ValueError(
                    f"{split}_ids has ids outside the tokenizer's vocabulary "
                    f"[0, {tokenizer.vocab_size})"
                )
        h = hashlib.sha256(source_fingerprint.encode())
        h.update(tokenizer._tok.to_str().encode())
        for split in ("train", "valid"):
            h.update(self.splits[split].numpy().tobytes())
        self.fingerprint = h.hexdigest()[:16]
        self.metric_name = "mlm_loss"
        self._batcher: WindowBatcher | None = None
        self._pending: dict[str, Any] | None = None
        self._accepts: dict[int, dict[str, bool]] = {}

    # ---- constructors --------------------------------------------------------------------

    @classmethod
    def from_texts(
        cls,
        train_texts: Sequence[str],
        valid_texts: Sequence[str],
        tokenizer: SubwordTokenizer | None = None,
        *,
        vocab_size: int = 8000,
        test_texts: Sequence[str] | None = None,
        **kwargs: Any,
    ) -> MLMTask:
        """Tokenize text splits (lines/documents); trains a WordPiece tokenizer of
        ``vocab_size`` on ``train_texts`` when ``tokenizer`` is None."""
        if tokenizer is None:
            what = f"training a WordPiece vocabulary of {vocab_size} on {len(train_texts)} texts"
            with status(what, logger):
                tokenizer = SubwordTokenizer.train(train_texts, vocab_size=vocab_size)
        fp = hashlib.sha256()
        for texts in (train_texts, valid_texts):
            for t in texts:
                fp.update(t.encode())
                fp.update(b"\n")
            fp.update(b"\0")
        kwargs.setdefault("source_fingerprint", fp.hexdigest()[:16])
        return cls(
            tokenize_stream(tokenizer, train_texts),
            tokenize_stream(tokenizer, valid_texts),
            tokenizer,
            test_ids=None if test_texts is None else tokenize_stream(tokenizer, test_texts),
            **kwargs,
        )

    @classmethod
    def from_corpus(
        cls,
        corpus: Corpus,
        tokenizer: SubwordTokenizer | None = None,
        *,
        vocab_size: int = 8000,
        **kwargs: Any,
    ) -> MLMTask:
        """Any corpus the LM readers return, decoded to text (see the module docstring)."""
        if not isinstance(corpus, Corpus):
            raise TypeError(
                f"corpus must be an effiformer.data.Corpus, got {type(corpus).__name__}"
            )
        kwargs.setdefault("name", corpus.name)
        kwargs.setdefault("source_fingerprint", corpus.fingerprint)
        return cls.from_texts(
            corpus_texts(corpus, "train"),
            corpus_texts(corpus, "valid"),
            tokenizer,
            vocab_size=vocab_size,
            test_texts=corpus_texts(corpus, "test"),
            **kwargs,
        )

    # ---- batches -------------------------------------------------------------------------

    def check_model(self, model: nn.Module) -> None:
        config = getattr(model, "config", None)
        if config is None:
            return
        if config.vocab_size < self.tokenizer.vocab_size:
            raise ValueError(
                f"the tokenizer has {self.tokenizer.vocab_size} ids but the model's vocab_size is "
                f"{config.vocab_size}; build the model with vocab_size={self.tokenizer.vocab_size}"
            )
        if self.seq_len > config.seq_len:
            raise ValueError(
                f"seq_len={self.seq_len} exceeds the model's seq_len={config.seq_len}; "
                "train on shorter rows or build the model with a larger seq_len"
            )

    def _wrap(self, windows: Tensor) -> Tensor:
        """(B, T - 2) subword windows -> (B, T) ``[CLS] window [SEP]`` (padding stays padding)."""
        b = windows.shape[0]
        cls = torch.full((b, 1), self.tokenizer.cls_id, dtype=torch.int64)
        sep = torch.full((b, 1), PAD_ID, dtype=torch.int64)
        ids = torch.cat([cls, windows, sep], dim=1)  # (B, T)
        length = (windows != PAD_ID).sum(dim=1)  # (B,) real subwords per row (right-padded)
        ids[torch.arange(b), length + 1] = self.tokenizer.sep_id
        return ids

    def make_batch(self, windows: Tensor, generator: torch.Generator) -> Batch:
        """Wrap (B, T - 2) windows, mask them with ``generator``: ``input_ids`` (masked),
        ``targets``, ``attention_mask``, ``token_type_ids``, all (B, T)."""
        ids = self._wrap(windows)
        masked, targets = mask_tokens(
            ids,
            vocab_size=self.tokenizer.vocab_size,
            generator=generator,
            mask_prob=self.mask_prob,
        )
        types = torch.zeros_like(ids)
        types[:, 0] = CLS_TOKEN_TYPE_ID  # [CLS] is its own segment (Funnel convention)
        attention = (ids != PAD_ID).long()
        return Batch(
            {
                "input_ids": masked,
                "targets": targets,
                "attention_mask": attention,
                "token_type_ids": types,
            }
        )

    def train_batches(self, model: nn.Module, rank: int = 0, world: int = 1) -> Iterator[Batch]:
        """This rank's rows of each global batch, every tensor (B / world, seq_len)."""
        self.check_model(model)
        lo, rows = rank_rows(self.batch_size, rank, world)
        batcher = WindowBatcher(self.splits["train"], self.batch_size, self.seq_len - 2, self.seed)
        if self._pending is not None:
            restore_position(batcher, self._pending["position"])
            self._pending = None
        self._batcher = batcher

        def _iterate() -> Iterator[Batch]:
            while True:
                epoch, position = batcher.epoch, batcher.position
                x, _ = next(batcher)  # (B, T - 2)
                gen = _generator("mlm", self.seed, epoch, position)
                batch = self.make_batch(x, gen)
                yield Batch({k: v[lo : lo + rows] for k, v in batch.data.items()})

        return _iterate()

    def forward(
        self,
        model: nn.Module,
        batch: Batch,
        state: Any = None,
        *,
        generator: torch.Generator | None = None,
    ) -> ModelOutput:
        d = batch.data
        key = id(model)
        if key not in self._accepts:
            self._accepts[key] = {
                n: _model_accepts(model, n) for n in ("token_type_ids", "generator")
            }
        accepts = self._accepts[key]
        kwargs: dict[str, Any] = {"targets": d["targets"], "attention_mask": d["attention_mask"]}
        if accepts["token_type_ids"]:
            kwargs["token_type_ids"] = d["token_type_ids"]
        if self.objective == "electra":
            if not accepts["generator"]:
                raise TypeError(
                    f"{type(model).__name__}.forward takes no generator=; objective='electra' "
                    "needs an ELECTRA generator+discriminator model"
                )
            if generator is None:  # training: seeded by the (seeded) masked batch itself
                digest = hashlib.sha256(d["input_ids"].cpu().numpy().tobytes()).hexdigest()
                generator = _generator("electra", self.seed, digest)
                if d["input_ids"].device.type != "cpu":
                    generator = _device_generator(generator, d["input_ids"].device)
            kwargs["generator"] = generator
        return model(d["input_ids"], **kwargs)

    # ---- evaluation ----------------------------------------------------------------------

    def eval_windows_of(self, split: str) -> Tensor:
        """Consecutive windows of ``split``, shape (W, seq_len - 2); the last one right-padded."""
        if split not in self.splits:
            raise ValueError(f"split must be one of {list(self.splits)}, got {split!r}")
        data = self.splits[split]
        t = self.seq_len - 2
        n_windows = -(-data.numel() // t)
        if self.eval_windows is not None:
            n_windows = min(n_windows, self.eval_windows)
            data = data[: n_windows * t]
        padded = torch.full((n_windows * t,), PAD_ID, dtype=torch.int64)
        padded[: data.numel()] = data
        return padded.view(n_windows, t)  # (W, T - 2)

    @torch.no_grad()
    def evaluate(
        self,
        model: nn.Module,
        split: str = "valid",
        *,
        device: torch.device | str = "cpu",
        autocast: AbstractContextManager | None = None,
    ) -> dict[str, float]:
        """Metrics over ``split`` with fixed masks: ``mlm_loss`` (nats per masked token),
        ``mlm_accuracy``, ``masked_tokens`` and ``loss`` (the model's training loss, per masked
        token). ELECTRA: ``mlm_loss`` is the generator's; ``disc_loss`` and ``disc_accuracy``
        (replaced-token detection over real tokens) replace ``mlm_accuracy``, and ``loss`` is
        generator + 50 x discriminator loss."""
        windows = self.eval_windows_of(split)
        was_training = model.training
        model.eval()
        n_masked = correct = n_real = disc_correct = 0
        total = mlm_sum = disc_sum = 0.0
        try:
            starts = range(0, windows.shape[0], self.eval_batch_size)
            for i in track(starts, desc=f"eval {split}", unit="batch"):
                gen = _generator("mlm-eval", self.seed, split, i)
                batch = self.make_batch(windows[i : i + self.eval_batch_size], gen).to(device)
                sampler = _generator("electra-eval", self.seed, split, i)
                if batch.data["input_ids"].device.type != "cpu":
                    sampler = _device_generator(sampler, batch.data["input_ids"].device)
                with autocast if autocast is not None else contextlib.nullcontext():
                    out = self.forward(model, batch, None, generator=sampler)
                targets = batch.data["targets"]
                sel = targets != IGNORE_INDEX
                k = int(sel.sum())
                n_masked += k
                total += float(out.loss.double()) * k
                if self.objective == "mlm":
                    mlm_sum += float(out.loss.double()) * k
                    correct += int((out.logits.argmax(-1)[sel] == targets[sel]).sum())
                else:  # ElectraOutput: generator MLM loss, discriminator loss and logits (B, T)
                    mlm_sum += float(out.generator_loss.double()) * k
                    real = batch.data["attention_mask"].bool()
                    n = int(real.sum())
                    n_real += n
                    disc_sum += float(out.discriminator_loss.double()) * n
                    guess = out.logits > 0
                    disc_correct += int((guess == out.replaced)[real].sum())
        finally:
            model.train(was_training)
        result: dict[str, float] = {
            "mlm_loss": mlm_sum / n_masked,
            "loss": total / n_masked,
            "masked_tokens": n_masked,
        }
        if self.objective == "mlm":
            result["mlm_accuracy"] = correct / n_masked
        else:
            result["disc_loss"] = disc_sum / n_real
            result["disc_accuracy"] = disc_correct / n_real
        return result

    # ---- state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        if self._batcher is not None:
            position: dict[str, int] | None = self._batcher.state_dict()
        elif self._pending is not None:
            position = self._pending["position"]
        else:
            position = None
        return {"fingerprint": self.fingerprint, "position": position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"the saved data position is for data with fingerprint "
                f"{state.get('fingerprint')!r}, but this data ({self.name}, with this tokenizer) "
                f"has fingerprint {self.fingerprint!r}; resume on the same data and tokenizer"
            )
        self._batcher = None
        self._pending = None if state.get("position") is None else dict(state)

    def describe(self) -> dict[str, Any]:
        return {
            "task": self.objective,
            "corpus": self.name,
            "fingerprint": self.fingerprint,
            "data": self.data_spec,
            "vocab_size": self.tokenizer.vocab_size,
            "tokens": {k: int(v.numel()) for k, v in self.splits.items()},
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "mask_prob": self.mask_prob,
            "eval_batch_size": self.eval_batch_size,
            "eval_windows": self.eval_windows,
        }

    def artifacts(self) -> dict[str, bytes]:
        return {"tokenizer.json": self.tokenizer._tok.to_str(pretty=False).encode("utf-8")}

    def __repr__(self) -> str:
        return (
            f"MLMTask(objective={self.objective!r}, data={self.name!r}, "
            f"vocab_size={self.tokenizer.vocab_size}, batch_size={self.batch_size}, "
            f"seq_len={self.seq_len}, seed={self.seed})"
        )


# ------------------------------------------------------------------------------------------------
# Registration: options and builders of the "mlm" and "electra" tasks
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class MLMOptions:
    """Options of the ``mlm`` task: masked-LM pretraining of a registered encoder on ``text``
    (split 95/5 by lines) or a corpus ``data``/``format``; a WordPiece tokenizer of
    ``vocab_size`` is trained on the training split unless ``tokenizer`` is given, and saved in
    every checkpoint."""

    text: str | None = task_option(
        None, "UTF-8 text file or folder to pretrain on (split 95/5 by lines)", metavar="PATH"
    )
    data: str | None = task_option(None, "a corpus for the LM readers (with --format)")
    format: str | None = task_option(None, "corpus format of --data", choices=FORMATS)
    tokenizer: str | None = task_option(
        None, "an existing tokenizer.json (default: train one)", metavar="PATH"
    )
    vocab_size: int = task_option(8000, "subword vocabulary size of the trained tokenizer")
    batch: int = task_option(16, "global batch size in rows")
    seq_len: int = task_option(128, "tokens per row, [CLS] and [SEP] included")
    eval_windows: int = task_option(256, "evaluate on the first N windows of a split", metavar="N")

    def __post_init__(self) -> None:
        for name in ("vocab_size", "batch", "seq_len", "eval_windows"):
            _positive_int(name, getattr(self, name))
        if self.seq_len < 3:
            raise ValueError(f"seq_len must be >= 3 ([CLS], a token, [SEP]), got {self.seq_len}")
        if (self.text is None) == (self.data is None):
            raise ValueError("give exactly one of --text PATH or --data PATH --format FORMAT")
        if self.data is not None and self.format is None:
            raise ValueError(f"--data needs --format (one of {', '.join(FORMATS)})")


@dataclass(frozen=True, kw_only=True)
class ElectraOptions(MLMOptions):
    """Options of the ``electra`` task: :class:`MLMOptions` plus the generator's size."""

    generator_scale: int = task_option(4, "ELECTRA generator width: dim / N (heads / N)")

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive_int("generator_scale", self.generator_scale)


def electra_generator_config(config: ModelConfig, scale: int) -> ModelConfig:
    """The ELECTRA generator's config: the discriminator's with ``dim / scale`` and
    ``n_heads / scale`` (at least one head)."""
    return replace_config(
        config, dim=config.dim // scale, n_heads=max(1, config.n_heads // scale), head_dim=None
    )


def _mlm_data(options: MLMOptions, tokenizer: SubwordTokenizer | None, common: dict) -> MLMTask:
    if options.text is not None:
        with status(f"reading {options.text}", logger):
            lines = read_texts(options.text)
        k = max(1, len(lines) // 20)
        return MLMTask.from_texts(
            lines[:-k],
            lines[-k:],
            tokenizer,
            vocab_size=options.vocab_size,
            name=Path(options.text).name,
            data_spec={"text": str(Path(options.text).resolve())},
            **common,
        )
    with status(f"reading the {options.format} corpus {options.data}", logger):
        corpus = load_corpus(options.data, options.format)
    return MLMTask.from_corpus(
        corpus,
        tokenizer,
        vocab_size=options.vocab_size,
        data_spec={"path": str(Path(options.data).resolve()), "format": options.format},
        **common,
    )


def _build(objective: str, options: MLMOptions, context: BuildContext) -> TaskSetup:
    if context.resume is not None:
        tokenizer: SubwordTokenizer | None = SubwordTokenizer.load(context.resume)
    elif options.tokenizer is not None:
        tokenizer = SubwordTokenizer.load(options.tokenizer)
    else:
        tokenizer = None
    common = {
        "objective": objective,
        "batch_size": options.batch,
        "seq_len": options.seq_len,
        "seed": context.seed,
        "eval_windows": options.eval_windows,
    }
    name = context.model_name
    if name is None:
        raise ValueError(f"--task {objective} needs a registered model NAME")
    task = _mlm_data(options, tokenizer, common)
    if context.resume is not None:
        config = load_config(context.resume)
        config = replace_config(config, **parse_overrides(config, context.overrides))
    else:
        base = get_spec(name).config
        overrides = parse_overrides(base, context.overrides)
        overrides.update(vocab_size=task.tokenizer.vocab_size, seq_len=max(options.seq_len, 16))
        if base.family == "vanilla":
            overrides.setdefault("causal", False)  # the dense baseline as a BERT-style encoder
        config = get_config(name, **overrides)
    torch.manual_seed(context.seed)
    if objective == "electra":
        model = _electra(config, options.generator_scale)  # type: ignore[attr-defined]
    else:
        model = build_model(config)
    return TaskSetup(task=task, model=model, model_name=name, data_name=task.name)


def _electra(config: ModelConfig, scale: int) -> nn.Module:
    from ..models.funnel import FunnelElectra

    if config.family != "funnel":
        raise ValueError(f"--task electra needs a Funnel model (funnel-*), got a {config.family}")
    return FunnelElectra(config, electra_generator_config(config, scale))


def build_mlm(options: MLMOptions, context: BuildContext) -> TaskSetup:
    """The ``mlm`` task: an :class:`MLMTask` and the registered encoder (a vanilla model is
    built with ``causal=False``)."""
    return _build("mlm", options, context)


def build_electra(options: ElectraOptions, context: BuildContext) -> TaskSetup:
    """The ``electra`` task: an :class:`MLMTask` with ``objective="electra"`` and a
    :class:`~effiformer.models.funnel.FunnelElectra` generator + discriminator pair."""
    return _build("electra", options, context)


def _load_electra(checkpoint: Path, options: ElectraOptions) -> nn.Module:
    model = _electra(load_config(checkpoint), options.generator_scale)
    load_weights(model, checkpoint)
    return model


def _load_mlm(checkpoint: Path, options: MLMOptions) -> nn.Module:
    return load_checkpoint(checkpoint)[0]


def _no_eval(checkpoint: Path, meta: dict[str, Any], options: Any, **kw: Any) -> Any:
    raise ValueError(
        f"{str(checkpoint)!r} is a {meta.get('task', {}).get('task')!r} pretraining checkpoint; "
        "its validation figures are in the run's metrics.jsonl, and `effiformer train --task "
        "glue-* --init RUN` fine-tunes it"
    )


@dataclass(frozen=True, kw_only=True)
class _NoEvalOptions:
    """Pretraining checkpoints take no evaluation options."""


register_task(
    "mlm",
    MLMOptions,
    build_mlm,
    description="masked-LM pretraining on --text or --data/--format (a subword tokenizer is "
    "trained and saved)",
    eval_options=_NoEvalOptions,
    evaluate=_no_eval,
    load_model=_load_mlm,
)
register_task(
    "electra",
    ElectraOptions,
    build_electra,
    description="ELECTRA pretraining of a Funnel model (generator + discriminator)",
    eval_options=_NoEvalOptions,
    evaluate=_no_eval,
    load_model=_load_electra,
)
