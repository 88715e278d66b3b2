"""Parallel corpora for translation: aligned files, a joint BPE vocabulary, token-budget batches.

* :func:`read_lines` / :func:`read_parallel`: two aligned UTF-8 files (plain or gzip, told
  apart by their first bytes), line ``i`` of one the translation of line ``i`` of the other.
  Lines are split on ``\\n`` only (a ``\\u2028`` inside a sentence does not shift the
  alignment) and stripped of surrounding whitespace. Files of different line counts are refused
  with both names and counts; empty lines are refused with their line numbers unless
  ``empty="skip"`` drops those pairs.
* :class:`ParallelData`: a folder of ``{split}.{lang}`` or ``{split}.{lang}.gz`` files (the
  Multi30k layout: ``train.en.gz``, ``val.de.gz``, ``test_2016_flickr.en.gz`` ...), any split
  by name, either direction.
* :func:`train_joint_tokenizer`: one BPE vocabulary for both languages, trained with HF
  ``tokenizers`` on the training split's two sides (:class:`~effiformer.data.tokenizer.SubwordTokenizer`
  in ``text="raw"`` mode, which decodes back to the original text), to be saved beside the
  checkpoint.
* :class:`TokenBatcher`: fairseq's ``batch_by_size`` with ``--max-tokens``: pairs sorted by
  source then target length (ties in an order drawn per epoch), cut into batches of at most
  ``max_tokens`` padded tokens (rows x the longest side), the batches visited in a fresh random
  order each epoch. Its only state is ``(epoch, position)``, deterministic from ``seed``, so a
  resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from .tokenizer import SubwordTokenizer

__all__ = [
    "ParallelData",
    "ParallelDataError",
    "ParallelSplit",
    "TokenBatcher",
    "read_lines",
    "read_parallel",
    "train_joint_tokenizer",
]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]
EmptyPolicy = Literal["error", "skip"]


class ParallelDataError(ValueError):
    """A missing, unreadable or misaligned parallel corpus; the message names the files."""


def _open_bytes(path: Path) -> bytes:
    if not path.is_file():
        raise ParallelDataError(f"{path}: no such file")
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise ParallelDataError(f"{path}: a truncated or corrupt gzip file ({e})") from None
    return raw


def read_lines(path: PathLike) -> list[str]:
    """The lines of a UTF-8 text file, plain or gzip, split on ``\\n`` and stripped."""
    p = Path(path)
    raw = _open_bytes(p)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ParallelDataError(f"{p}: line {line} is not valid UTF-8 ({e.reason})") from None
    if text.endswith("\n"):
        text = text[:-1]
    if not text:
        return []
    return [line.strip() for line in text.split("\n")]


def read_parallel(
    src_path: PathLike, tgt_path: PathLike, *, empty: EmptyPolicy = "error"
) -> tuple[list[str], list[str]]:
    """Aligned (source lines, target lines) of two files; see the module docstring."""
    if empty not in ("error", "skip"):
        raise ValueError(f"empty must be 'error' or 'skip', got {empty!r}")
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise ParallelDataError(
            f"the parallel files are not aligned: {src_path} has {len(src)} lines but "
            f"{tgt_path} has {len(tgt)}"
        )
    if not src:
        raise ParallelDataError(f"{src_path} and {tgt_path} are empty")
    bad = [i for i, (s, t) in enumerate(zip(src, tgt)) if not s or not t]
    if bad:
        if empty == "error":
            where = ", ".join(str(i + 1) for i in bad[:5]) + (" ..." if len(bad) > 5 else "")
            raise ParallelDataError(
                f"{len(bad)} empty line(s) in {src_path} / {tgt_path} (line {where}); an empty "
                "sentence has no translation to learn: remove those pairs or read with "
                "empty='skip'"
            )
        drop = set(bad)
        logger.warning(
            "skipping %d pairs with an empty side in %s / %s", len(bad), src_path, tgt_path
        )
        src = [s for i, s in enumerate(src) if i not in drop]
        tgt = [t for i, t in enumerate(tgt) if i not in drop]
    return src, tgt


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    h.update(_open_bytes(path))
    return h.hexdigest()


@dataclass(frozen=True)
class ParallelSplit:
    """One split: aligned ``src`` / ``tgt`` sentences, the files they came from, the languages
    and a fingerprint (sha256 of both files' decompressed bytes and the direction)."""

    name: str
    src: list[str]
    tgt: list[str]
    src_lang: str
    tgt_lang: str
    src_path: Path
    tgt_path: Path
    fingerprint: str

    def __len__(self) -> int:
        return len(self.src)


class ParallelData:
    """A folder of ``{split}.{lang}[.gz]`` files read in the direction ``src`` -> ``tgt``."""

    def __init__(self, root: PathLike, src: str, tgt: str, *, empty: EmptyPolicy = "error") -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise ParallelDataError(f"{self.root}: no such data folder")
        for name, lang in (("src", src), ("tgt", tgt)):
            if not isinstance(lang, str) or not lang or "." in lang or "/" in lang:
                raise ValueError(f"{name} must be a language code such as 'en', got {lang!r}")
        if src == tgt:
            raise ValueError(f"src and tgt must be different languages, got {src!r} twice")
        self.src_lang, self.tgt_lang = src, tgt
        self.empty = empty
        self._cache: dict[str, ParallelSplit] = {}

    def _file(self, split: str, lang: str) -> Path | None:
        for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
            if (self.root / name).is_file():
                return self.root / name
        return None

    def splits(self) -> list[str]:
        """Split names with both languages present, sorted."""
        names = set()
        for p in self.root.iterdir():
            n = p.name.removesuffix(".gz")
            if n.endswith(f".{self.src_lang}"):
                split = n[: -len(self.src_lang) - 1]
                if self._file(split, self.tgt_lang) is not None:
                    names.add(split)
        return sorted(names)

    def split(self, name: str) -> ParallelSplit:
        if name in self._cache:
            return self._cache[name]
        src_path, tgt_path = self._file(name, self.src_lang), self._file(name, self.tgt_lang)
        if src_path is None or tgt_path is None:
            lang = self.src_lang if src_path is None else self.tgt_lang
            raise ParallelDataError(
                f"{self.root} has no split {name!r} for {self.src_lang}-{self.tgt_lang} (no "
                f"{name}.{lang} or {name}.{lang}.gz); splits there: "
                f"{', '.join(self.splits()) or '(none)'}"
            )
        src, tgt = read_parallel(src_path, tgt_path, empty=self.empty)
        h = hashlib.sha256(f"{self.src_lang}->{self.tgt_lang}".encode())
        h.update(_file_digest(src_path).encode())
        h.update(_file_digest(tgt_path).encode())
        out = ParallelSplit(
            name, src, tgt, self.src_lang, self.tgt_lang, src_path, tgt_path, h.hexdigest()[:16]
        )
        self._cache[name] = out
        return out

    def __repr__(self) -> str:
        return f"ParallelData({str(self.root)!r}, {self.src_lang!r} -> {self.tgt_lang!r})"


def train_joint_tokenizer(
    split: ParallelSplit, *, vocab_size: int = 8000, min_frequency: int = 2
) -> SubwordTokenizer:
    """A joint BPE vocabulary of both sides of ``split`` (the training split), case and accents
    kept, decoding back to the original text (``SubwordTokenizer.train(text="raw")``)."""
    return SubwordTokenizer.train(
        [*split.src, *split.tgt],
        vocab_size=vocab_size,
        algorithm="bpe",
        lowercase=False,
        min_frequency=min_frequency,
        text="raw",
    )


def _seeded_rng(seed: int, epoch: int) -> np.random.Generator:
    digest = hashlib.sha256(f"TokenBatcher:{seed}:{epoch}".encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


class TokenBatcher:
    """Batches of pair indices under a token budget; see the module docstring.

    ``src_lengths`` / ``tgt_lengths``: tokens of each pair's source and decoder sequence (EOS /
    BOS included); ``max_tokens``: most ``rows * max(longest source, longest target)`` per
    batch; ``max_sentences``: most rows (None: no limit); ``shuffle``: fresh tie order and batch
    order each epoch (False: one fixed length-sorted order, for evaluation).
    ``next(batcher)`` returns an int64 array of pair indices and advances, wrapping to the next
    epoch; ``state_dict()`` / ``load_state_dict()`` save and restore ``(epoch, position)``.
    """

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        max_tokens: int,
        *,
        seed: int = 0,
        max_sentences: int | None = None,
        shuffle: bool = True,
    ) -> None:
        self._src = np.asarray(src_lengths, dtype=np.int64)
        self._tgt = np.asarray(tgt_lengths, dtype=np.int64)
        if self._src.shape != self._tgt.shape or self._src.ndim != 1 or not len(self._src):
            raise ValueError("src_lengths and tgt_lengths must be equal-length, non-empty lists")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if max_sentences is not None and (max_sentences < 1 or isinstance(max_sentences, bool)):
            raise ValueError(f"max_sentences must be a positive int or None, got {max_sentences!r}")
        longest = np.maximum(self._src, self._tgt)
        if int(longest.max()) > max_tokens:
            i = int(longest.argmax())
            raise ValueError(
                f"pair {i} has {int(longest[i])} tokens on its longer side, more than "
                f"max_tokens={max_tokens}; raise max_tokens"
            )
        self.max_tokens, self.max_sentences = max_tokens, max_sentences
        self.seed, self.shuffle = seed, shuffle
        self._epoch, self._position = 0, 0
        self._cache: tuple[int, list[np.ndarray]] | None = None  # memo: a function of epoch
        h = hashlib.sha256(self._src.tobytes())
        h.update(self._tgt.tobytes())
        self._lengths_digest = h.hexdigest()[:16]

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def position(self) -> int:
        return self._position

    def batches(self, epoch: int = 0) -> list[np.ndarray]:
        """Every batch of ``epoch``, in visiting order (int64 index arrays)."""
        if self._cache is not None and self._cache[0] == epoch:
            return self._cache[1]
        n = len(self._src)
        if self.shuffle:
            rng = _seeded_rng(self.seed, epoch)
            order = rng.permutation(n)
        else:
            rng, order = None, np.arange(n)
        order = order[np.argsort(self._tgt[order], kind="stable")]
        order = order[np.argsort(self._src[order], kind="stable")]
        longest = np.maximum(self._src, self._tgt)[order]
        out: list[np.ndarray] = []
        start, width = 0, 0
        for i in range(n):
            w = max(width, int(longest[i]))
            rows = i - start + 1
            over = w * rows > self.max_tokens or (
                self.max_sentences is not None and rows > self.max_sentences
            )
            if over:
                out.append(order[start:i])
                start, w = i, int(longest[i])
            width = w
        out.append(order[start:])
        if rng is not None:
            out = [out[j] for j in rng.permutation(len(out))]
        self._cache = (epoch, out)
        return out

    def __len__(self) -> int:
        """Batches in the current epoch."""
        return len(self.batches(self._epoch))

    def __iter__(self) -> TokenBatcher:
        return self

    def __next__(self) -> np.ndarray:
        batches = self.batches(self._epoch)
        out = batches[self._position]
        self._position += 1
        if self._position == len(batches):
            self._epoch, self._position = self._epoch + 1, 0
        return out

    def _config(self) -> dict:
        return {
            "max_tokens": self.max_tokens,
            "max_sentences": self.max_sentences,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "lengths": self._lengths_digest,
        }

    def state_dict(self) -> dict:
        """``{"epoch", "position"}`` plus the configuration the position is valid for."""
        return {"epoch": self._epoch, "position": self._position, **self._config()}

    def load_state_dict(self, state: Mapping) -> None:
        expected = set(self.state_dict())
        if set(state) != expected:
            raise ValueError(
                f"TokenBatcher state must have exactly the keys {sorted(expected)}, got "
                f"{sorted(state)}"
            )
        for key, value in self._config().items():
            if state[key] != value:
                raise ValueError(
                    f"TokenBatcher state has {key}={state[key]!r} but this batcher has "
                    f"{key}={value!r}"
                )
        epoch, position = state["epoch"], state["position"]
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"state epoch must be an int >= 0, got {epoch!r}")
        n = len(self.batches(epoch))
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < n:
            raise ValueError(f"state position must be an int in [0, {n}), got {position!r}")
        self._epoch, self._position = epoch, position

    def __repr__(self) -> str:
        return (
            f"TokenBatcher(pairs={len(self._src)}, max_tokens={self.max_tokens}, "
            f"epoch={self._epoch}, position={self._position})"
        )
