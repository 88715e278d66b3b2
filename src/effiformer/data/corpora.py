"""Language-modelling corpora: a vocabulary, a three-split corpus, and readers for real formats.

Every reader returns a :class:`Corpus` whose ``train``/``valid``/``test`` are 1-D ``int64``
tensors of token ids, shape ``(N,)``, and whose ``fingerprint`` identifies the source content so
results can record exactly what they were measured on. :func:`load_corpus` dispatches by format
name; :func:`embedded_corpus` needs no files at all (the running interpreter's standard library).

==============  ======  ======  ==================================================================
format          unit    metric  files
==============  ======  ======  ==================================================================
``enwik8``      byte    bpc     ``enwik8`` | ``enwik8.zip`` | a directory holding one of them
``text8``       char    bpc     ``text8`` | ``text8.zip`` | a directory holding one of them
``ptb``         word    ppl     directory with ``ptb.{train,valid,test}.txt`` (Mikolov)
``ptb-char``    char    bpc     directory with ``ptb.char.{train,valid,test}.txt`` or the word files
``wikitext``    word    ppl     directory with ``wiki.{train,valid,test}.tokens`` (WikiText-2/103)
``text``        byte    bpc     any UTF-8 text file, or a folder of them (split 90/5/5)
==============  ======  ======  ==================================================================

Word-level files follow the Transformer-XL / AWD-LSTM convention: every line (empty ones
included) is split on whitespace and ends with ``<eos>``. Errors about files raise
:class:`CorpusError` naming the path and the problem.
"""

from __future__ import annotations

import array
import hashlib
import json
import logging
import os
import platform
import sysconfig
import zipfile
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType
from typing import Literal

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "FORMATS",
    "Corpus",
    "CorpusError",
    "Vocab",
    "embedded_corpus",
    "load_corpus",
    "read_enwik8",
    "read_ptb",
    "read_ptb_char",
    "read_text",
    "read_text8",
    "read_wikitext",
]

logger = logging.getLogger(__name__)

Unit = Literal["byte", "char", "word"]
PathLike = str | os.PathLike[str]

_UNITS: tuple[str, ...] = ("byte", "char", "word")
_BYTE_TOKENS: tuple[str, ...] = tuple(chr(i) for i in range(256))
_TEXT8_ALPHABET = b"abcdefghijklmnopqrstuvwxyz "
_EOS = "<eos>"
_UNK = "<unk>"
_VOCAB_FORMAT = "effiformer-vocab"
_VOCAB_VERSION = 1


class CorpusError(ValueError):
    """A corpus or token sequence cannot be read; the message names the path/token and why."""


# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Vocab:
    """Token <-> id maps for one unit: ``"byte"``, ``"char"`` or ``"word"``.

    ``tokens[i]`` is the token of id ``i``; :attr:`token_to_id` is the inverse map.

    * byte: always the 256 byte values, token ``i`` is ``chr(i)`` (latin-1); build with
      :meth:`byte_level`. ``encode(str)`` encodes UTF-8; ``decode`` decodes UTF-8 (invalid
      sequences become U+FFFD).
    * char: one character per token, except the specials ``unk``/``eos``. ``encode(str)`` maps
      each character; a ``"\\n"`` maps to ``eos`` when ``"\\n"`` is not itself a token, and
      ``decode`` writes ``eos`` back as ``"\\n"``.
    * word: whitespace-free tokens. ``encode(str)`` splits each line on whitespace and, when the
      vocab has ``eos``, puts ``eos`` at each ``"\\n"``; ``decode`` joins words with spaces and
      writes ``eos`` as ``"\\n"``.

    So ``encode(decode(ids))`` equals ``ids`` (except byte ids that are not valid UTF-8, and
    ``unk`` in a char vocab). Unknown tokens map to ``unk`` when the vocab has one; otherwise
    :meth:`encode` raises :class:`CorpusError` naming the token.
    """

    unit: Unit
    tokens: tuple[str, ...]
    unk: str | None = None
    eos: str | None = None
    _index: dict[str, int] = field(init=False, repr=False, compare=False)
    _ascii_lut: np.ndarray = field(init=False, repr=False, compare=False)
    _display: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.unit not in _UNITS:
            raise ValueError(f"Vocab.unit must be one of {_UNITS}, got {self.unit!r}")
        tokens = tuple(self.tokens)
        object.__setattr__(self, "tokens", tokens)
        if not tokens:
            raise ValueError("Vocab.tokens must not be empty")
        index: dict[str, int] = {}
        for i, tok in enumerate(tokens):
            if not isinstance(tok, str):
                raise ValueError(f"Vocab.tokens[{i}] must be a str, got {type(tok).__name__}")
            if tok in index:
                raise ValueError(f"Vocab.tokens has {tok!r} twice (ids {index[tok]} and {i})")
            index[tok] = i
        for name in ("unk", "eos"):
            special = getattr(self, name)
            if special is not None and special not in index:
                raise ValueError(f"Vocab.{name}={special!r} is not one of the tokens")
        specials = {self.unk, self.eos}
        if self.unit == "byte":
            if tokens != _BYTE_TOKENS or self.unk is not None or self.eos is not None:
                raise ValueError(
                    "a byte Vocab has exactly the 256 tokens chr(0)..chr(255) and no unk/eos; "
                    "use Vocab.byte_level()"
                )
        elif self.unit == "char":
            for tok in tokens:
                if len(tok) != 1 and tok not in specials:
                    raise ValueError(
                        f"char Vocab token {tok!r} is not one character (only unk/eos may be longer)"
                    )
        else:
            for tok in tokens:
                if not tok or len(tok.split()) != 1 or tok.split()[0] != tok:
                    raise ValueError(f"word Vocab token {tok!r} is empty or contains whitespace")
        object.__setattr__(self, "_index", index)
        # How "\n" reads and eos writes: eos stands for the line end unless "\n" is a token.
        eos_is_newline = self.eos is not None and "\n" not in index
        display = tuple("\n" if eos_is_newline and t == self.eos else t for t in tokens)
        object.__setattr__(self, "_display", display)
        lut = np.full(128, -1, dtype=np.int64)  # ASCII code -> char id, -1 if absent
        if self.unit == "char":
            for code in range(128):
                ch = chr(code)
                if ch in index:
                    lut[code] = index[ch]
                elif ch == "\n" and eos_is_newline:
                    lut[code] = index[self.eos]  # type: ignore[index]
        object.__setattr__(self, "_ascii_lut", lut)

    @classmethod
    def byte_level(cls) -> Vocab:
        """The fixed 256-token byte vocabulary."""
        return cls(unit="byte", tokens=_BYTE_TOKENS)

    @property
    def size(self) -> int:
        """Number of tokens (ids are ``0 .. size - 1``)."""
        return len(self.tokens)

    @property
    def token_to_id(self) -> Mapping[str, int]:
        """Read-only token -> id map (inverse of :attr:`tokens`)."""
        return MappingProxyType(self._index)

    def __repr__(self) -> str:
        return f"Vocab(unit={self.unit!r}, size={self.size}, unk={self.unk!r}, eos={self.eos!r})"

    # ---- encode ------------------------------------------------------------------------------

    def encode(self, data: str | bytes | Sequence[str]) -> Tensor:
        """Token ids of ``data``: a string, raw bytes (byte vocab only) or a token sequence.

        Returns a 1-D ``int64`` tensor, shape ``(N,)``.
        """
        if self.unit == "byte":
            if isinstance(data, str):
                return _bytes_to_ids(data.encode("utf-8"))
            if isinstance(data, bytes | bytearray | memoryview):
                return _bytes_to_ids(bytes(data))
            raise TypeError(f"a byte Vocab encodes str or bytes, got {type(data).__name__}")
        if isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"a {self.unit} Vocab encodes str or a token sequence, not bytes")
        if isinstance(data, str):
            if self.unit == "char":
                return self._encode_chars(data)
            return self._encode_words(data)[0]
        return self._encode_token_list(list(data))

    def _unknown(self, token: str, position: int) -> CorpusError:
        return CorpusError(
            f"{self.unit} {token!r} (token {position} of the input) is not in the vocab "
            f"(size {self.size}) and the vocab has no unk token"
        )

    def _encode_token_list(self, tokens: list[str]) -> Tensor:
        index, unk_id = self._index, self._unk_id()
        ids = []
        for pos, tok in enumerate(tokens):
            i = index.get(tok) if isinstance(tok, str) else None
            if i is None:
                if not isinstance(tok, str):
                    raise TypeError(f"token {pos} is a {type(tok).__name__}, expected str")
                if unk_id is None:
                    raise self._unknown(tok, pos)
                i = unk_id
            ids.append(i)
        return torch.tensor(ids, dtype=torch.int64)

    def _unk_id(self) -> int | None:
        return None if self.unk is None else self._index[self.unk]

    def _encode_ascii(self, raw: bytes) -> Tensor:
        """Char ids of ASCII bytes through a lookup table (fast path for text8 / PTB)."""
        ids = self._ascii_lut[np.frombuffer(raw, dtype=np.uint8)]  # (N,)
        bad = np.flatnonzero(ids < 0)
        if bad.size:
            unk_id = self._unk_id()
            if unk_id is None:
                raise self._unknown(chr(raw[int(bad[0])]), int(bad[0]))
            ids[bad] = unk_id
        return torch.from_numpy(ids)

    def _encode_chars(self, text: str) -> Tensor:
        if text.isascii():
            return self._encode_ascii(text.encode("ascii"))
        eos_is_newline = self.eos is not None and "\n" not in self._index
        newline = self.eos if eos_is_newline else "\n"
        return self._encode_token_list([newline if c == "\n" else c for c in text])

    def _encode_words(self, text: str) -> tuple[Tensor, int]:
        """Word ids of ``text`` and how many words were mapped to ``unk``."""
        index, unk_id = self._index, self._unk_id()
        eos_id = None if self.eos is None else self._index[self.eos]
        out = array.array("q")
        n_unk = 0
        lines = text.split("\n") if eos_id is not None else [text]
        last = len(lines) - 1
        for i, line in enumerate(lines):
            words = line.split()
            ids = [index.get(w, -1) for w in words]
            if -1 in ids:
                for k, (w, j) in enumerate(zip(words, ids)):
                    if j == -1:
                        if unk_id is None:
                            raise self._unknown(w, len(out) + k)
                        ids[k] = unk_id
                        n_unk += 1
            out.extend(ids)
            if eos_id is not None and i < last:
                out.append(eos_id)
        return torch.from_numpy(np.frombuffer(out, dtype=np.int64).copy()), n_unk

    # ---- decode ------------------------------------------------------------------------------

    def decode(self, ids: Tensor | Sequence[int]) -> str:
        """Text of a 1-D sequence of ids, shape ``(N,)`` (see the class docstring for the rules)."""
        if isinstance(ids, Tensor):
            if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex():
                raise ValueError(
                    f"ids must be a 1-D integer tensor, got shape {tuple(ids.shape)} {ids.dtype}"
                )
            values = ids.tolist()
        else:
            values = [int(i) for i in ids]
        for pos, i in enumerate(values):
            if not 0 <= i < self.size:
                raise ValueError(
                    f"id {i} at position {pos} is outside the vocab (size {self.size})"
                )
        if self.unit == "byte":
            return bytes(values).decode("utf-8", errors="replace")
        display = self._display
        if self.unit == "char":
            return "".join(display[i] for i in values)
        out: list[str] = []
        line: list[str] = []
        eos_id = None if self.eos is None else self._index[self.eos]
        for i in values:
            if i == eos_id:
                out.append(" ".join(line))
                out.append("\n")
                line = []
            else:
                line.append(display[i])
        out.append(" ".join(line))
        return "".join(out)

    # ---- serialisation -----------------------------------------------------------------------

    def to_json(self) -> str:
        """JSON text that :meth:`from_json` turns back into an equal vocab."""
        return json.dumps(
            {
                "format": _VOCAB_FORMAT,
                "version": _VOCAB_VERSION,
                "unit": self.unit,
                "unk": self.unk,
                "eos": self.eos,
                "tokens": None if self.unit == "byte" else list(self.tokens),
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, text: str) -> Vocab:
        """The vocab saved by :meth:`to_json`."""
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"vocab JSON does not parse: {e}") from e
        expected = {"format", "version", "unit", "unk", "eos", "tokens"}
        if not isinstance(obj, dict) or set(obj) != expected:
            got = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise ValueError(f"vocab JSON must have exactly the keys {sorted(expected)}, got {got}")
        if obj["format"] != _VOCAB_FORMAT or obj["version"] != _VOCAB_VERSION:
            raise ValueError(
                f"vocab JSON is {obj['format']!r} version {obj['version']!r}, "
                f"expected {_VOCAB_FORMAT!r} version {_VOCAB_VERSION}"
            )
        if obj["unit"] == "byte":
            if obj["tokens"] is not None or obj["unk"] is not None or obj["eos"] is not None:
                raise ValueError("byte vocab JSON must have tokens, unk and eos null")
            return cls.byte_level()
        if not isinstance(obj["tokens"], list):
            raise ValueError(f"vocab JSON 'tokens' must be a list, got {obj['tokens']!r}")
        return cls(unit=obj["unit"], tokens=tuple(obj["tokens"]), unk=obj["unk"], eos=obj["eos"])


def _bytes_to_ids(raw: bytes) -> Tensor:
    """Byte ids of ``raw``, shape ``(len(raw),)``, int64."""
    return torch.from_numpy(np.frombuffer(raw, dtype=np.uint8).astype(np.int64))


def _word_vocab(counts: Counter[str]) -> Vocab:
    """Words sorted by count (descending), ties lexicographically; deterministic."""
    tokens = tuple(w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return Vocab(
        unit="word",
        tokens=tokens,
        unk=_UNK if _UNK in counts else None,
        eos=_EOS if _EOS in counts else None,
    )


# --------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Corpus:
    """Three splits of token ids over one vocabulary.

    ``train``/``valid``/``test``: 1-D ``int64`` tensors, shape ``(N_split,)``, ids in
    ``[0, vocab.size)``. ``fingerprint``: 16 hex chars of a sha256 of the source content (for a
    single source file, the prefix of its ``sha256sum``). ``source``: the path(s) or a description.
    """

    name: str
    unit: Unit
    vocab: Vocab
    train: Tensor
    valid: Tensor
    test: Tensor
    fingerprint: str
    source: str

    def __post_init__(self) -> None:
        if self.unit != self.vocab.unit:
            raise ValueError(f"Corpus.unit={self.unit!r} but vocab.unit={self.vocab.unit!r}")
        for split in ("train", "valid", "test"):
            ids = getattr(self, split)
            if not isinstance(ids, Tensor) or ids.dim() != 1 or ids.dtype != torch.int64:
                desc = f"{tuple(ids.shape)} {ids.dtype}" if isinstance(ids, Tensor) else type(ids)
                raise ValueError(f"Corpus.{split} must be a 1-D int64 tensor, got {desc}")
            if ids.numel() == 0:
                raise CorpusError(f"{self.source}: the {split} split of {self.name} is empty")
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.vocab.size:
                raise ValueError(
                    f"Corpus.{split} has ids in [{lo}, {hi}], outside the vocab (size {self.vocab.size})"
                )

    @property
    def metric(self) -> Literal["bpc", "ppl"]:
        """``"bpc"`` (bits per character/byte) for byte/char units, ``"ppl"`` for words."""
        return "ppl" if self.unit == "word" else "bpc"

    def split(self, name: str) -> Tensor:
        """The split called ``name`` (``"train"``, ``"valid"`` or ``"test"``), shape ``(N,)``."""
        if name not in ("train", "valid", "test"):
            raise ValueError(f"split must be 'train', 'valid' or 'test', got {name!r}")
        return getattr(self, name)

    def __repr__(self) -> str:
        return (
            f"Corpus(name={self.name!r}, unit={self.unit!r}, vocab_size={self.vocab.size}, "
            f"train={self.train.numel()}, valid={self.valid.numel()}, test={self.test.numel()}, "
            f"fingerprint={self.fingerprint!r}, source={self.source!r})"
        )


# --------------------------------------------------------------------------------------------
# File helpers
# --------------------------------------------------------------------------------------------


def _fingerprint(*parts: bytes) -> str:
    """sha256 of one part, or of the concatenated sha256 digests of several; 16 hex chars."""
    if len(parts) == 1:
        return hashlib.sha256(parts[0]).hexdigest()[:16]
    digests = b"".join(hashlib.sha256(p).digest() for p in parts)
    return hashlib.sha256(digests).hexdigest()[:16]


def _read_file(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise CorpusError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise CorpusError(f"{path}: is a directory, expected a file") from None
    except OSError as e:
        raise CorpusError(f"{path}: cannot read ({e.strerror or e})") from None


def _decode_text(raw: bytes, path: Path | str) -> str:
    """UTF-8 text with universal newlines ("\\r\\n" and "\\r" become "\\n")."""
    if b"\x00" in raw:
        raise CorpusError(f"{path}: not a text file (contains NUL bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CorpusError(f"{path}: not UTF-8 text (invalid byte at offset {e.start})") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _split_sizes(n: int, source: str) -> tuple[int, int, int]:
    """90/5/5 contiguous split: valid = test = n // 20, train = the rest."""
    k = n // 20
    if k == 0:
        raise CorpusError(
            f"{source}: corpus of {n} units is too small to split 90/5/5 "
            "(need at least 20 so every split is non-empty)"
        )
    return n - 2 * k, k, k


def _directory(path: PathLike, fmt: str, expected: str) -> Path:
    d = Path(path)
    if not d.exists():
        raise CorpusError(
            f"{d}: no such directory (format {fmt!r} expects a directory with {expected})"
        )
    if not d.is_dir():
        raise CorpusError(f"{d}: is a file; format {fmt!r} expects a directory with {expected}")
    return d


def _split_files(d: Path, names: Mapping[str, str], fmt: str) -> dict[str, Path] | None:
    """The split files under ``d``; None if none exists; CorpusError if only some do."""
    paths = {split: d / name for split, name in names.items()}
    present = [p.is_file() for p in paths.values()]
    if not any(present):
        return None
    missing = [p.name for p, ok in zip(paths.values(), present) if not ok]
    if missing:
        raise CorpusError(f"{d}: incomplete {fmt!r} directory, missing {', '.join(missing)}")
    return paths


def _archive_member(path: PathLike, member: str) -> tuple[bytes, str]:
    """Bytes of ``member`` given as the raw file, ``<member>.zip`` or a directory of either."""
    p = Path(path)
    if not p.exists():
        raise CorpusError(
            f"{p}: no such file or directory (expected '{member}', '{member}.zip' "
            "or a directory holding one of them)"
        )
    if p.is_dir():
        for candidate in (p / member, p / f"{member}.zip"):
            if candidate.is_file():
                p = candidate
                break
        else:
            raise CorpusError(f"{p}: directory holds neither '{member}' nor '{member}.zip'")
    if not zipfile.is_zipfile(p):
        return _read_file(p), str(p)
    try:
        with zipfile.ZipFile(p) as zf:
            names = [n for n in zf.namelist() if not n.endswith("/")]
            matches = [n for n in names if PurePosixPath(n).name == member and "__MACOSX" not in n]
            if not matches:
                listed = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
                raise CorpusError(
                    f"{p}: zip archive has no member '{member}' (members: {listed or 'none'})"
                )
            return zf.read(matches[0]), f"{p}!{matches[0]}"
    except zipfile.BadZipFile as e:
        raise CorpusError(f"{p}: corrupt zip archive ({e})") from None


def _contiguous_corpus(
    *,
    name: str,
    unit: Unit,
    vocab: Vocab,
    raw: bytes,
    source: str,
    encode: Callable[[bytes], Tensor],
    fingerprint: str | None = None,
) -> Corpus:
    """Split ``raw`` 90/5/5 into contiguous pieces and encode each."""
    if not raw:
        raise CorpusError(f"{source}: empty corpus")
    n_train, n_valid, _ = _split_sizes(len(raw), source)
    a, b = n_train, n_train + n_valid
    corpus = Corpus(
        name=name,
        unit=unit,
        vocab=vocab,
        train=encode(raw[:a]),
        valid=encode(raw[a:b]),
        test=encode(raw[b:]),
        fingerprint=_fingerprint(raw) if fingerprint is None else fingerprint,
        source=source,
    )
    logger.info("loaded %r", corpus)
    return corpus


# --------------------------------------------------------------------------------------------
# Readers
# --------------------------------------------------------------------------------------------


def read_enwik8(path: PathLike) -> Corpus:
    """enwik8 (first 10^8 bytes of a 2006 English Wikipedia XML dump), byte level.

    ``path``: the raw ``enwik8`` file, the distributed ``enwik8.zip`` holding it, or a directory
    holding either. Split as in the Hutter-prize / Transformer-XL setup: for the full
    100,000,000 bytes, the first 90,000,000 are train, the next 5,000,000 valid and the last
    5,000,000 test. Any other size (e.g. a small fixture) is split in the same 90%/5%/5%
    proportions: valid = test = ``n // 20`` bytes, train = the rest. The vocab is all 256 bytes
    (Transformer-XL keeps only the ~200 bytes present; bpc is over the same targets either way).
    """
    raw, source = _archive_member(path, "enwik8")
    if len(raw) != 100_000_000:
        logger.info("%s: %d bytes, not the full enwik8; using a 90/5/5 split", source, len(raw))
    return _contiguous_corpus(
        name="enwik8",
        unit="byte",
        vocab=Vocab.byte_level(),
        raw=raw,
        source=source,
        encode=_bytes_to_ids,
    )


def read_text8(path: PathLike) -> Corpus:
    """text8 (enwik8 cleaned to lowercase ``a``-``z`` and space), character level.

    ``path``: the raw ``text8`` file, ``text8.zip`` or a directory holding either. Split like
    :func:`read_enwik8`: 90M/5M/5M characters for the full 10^8, else 90%/5%/5% (valid = test =
    ``n // 20``). The vocab is the characters present, sorted. A character outside the text8
    alphabet raises :class:`CorpusError` (the file is not text8).
    """
    raw, source = _archive_member(path, "text8")
    if not raw:
        raise CorpusError(f"{source}: empty corpus")
    codes = np.frombuffer(raw, dtype=np.uint8)
    allowed = np.zeros(256, dtype=bool)
    allowed[np.frombuffer(_TEXT8_ALPHABET, dtype=np.uint8)] = True
    bad = np.flatnonzero(~allowed[codes])
    if bad.size:
        pos = int(bad[0])
        raise CorpusError(
            f"{source}: not text8: byte {raw[pos : pos + 1]!r} at offset {pos} is outside the "
            "text8 alphabet (lowercase a-z and space)"
        )
    present = np.flatnonzero(np.bincount(codes, minlength=256))
    vocab = Vocab(unit="char", tokens=tuple(chr(int(c)) for c in present))
    if len(raw) != 100_000_000:
        logger.info("%s: %d chars, not the full text8; using a 90/5/5 split", source, len(raw))
    return _contiguous_corpus(
        name="text8", unit="char", vocab=vocab, raw=raw, source=source, encode=vocab._encode_ascii
    )


def _word_corpus(name: str, d: Path, paths: Mapping[str, Path]) -> Corpus:
    """Word-level corpus: each line's whitespace-split words then ``<eos>``; vocab from train."""
    raws = {split: _read_file(p) for split, p in paths.items()}
    texts = {}
    for split, p in paths.items():
        text = _decode_text(raws[split], p)
        if not text.strip():
            raise CorpusError(f"{p}: empty split (no tokens)")
        texts[split] = text if text.endswith("\n") else text + "\n"
    counts = Counter(texts["train"].split())
    counts[_EOS] += texts["train"].count("\n")
    vocab = _word_vocab(counts)
    ids = {}
    for split, text in texts.items():
        try:
            ids[split], n_unk = vocab._encode_words(text)
        except CorpusError as e:
            raise CorpusError(f"{paths[split]}: {e}") from None
        if n_unk:
            logger.warning(
                "%s: %d words not in the train vocab mapped to %s", paths[split], n_unk, _UNK
            )
    corpus = Corpus(
        name=name,
        unit="word",
        vocab=vocab,
        train=ids["train"],
        valid=ids["valid"],
        test=ids["test"],
        fingerprint=_fingerprint(raws["train"], raws["valid"], raws["test"]),
        source=str(d),
    )
    logger.info("loaded %r", corpus)
    return corpus


_PTB_FILES = {s: f"ptb.{s}.txt" for s in ("train", "valid", "test")}
_PTB_CHAR_FILES = {s: f"ptb.char.{s}.txt" for s in ("train", "valid", "test")}
_WIKITEXT_FILES = {s: f"wiki.{s}.tokens" for s in ("train", "valid", "test")}


def read_ptb(path: PathLike) -> Corpus:
    """Penn Treebank, word level (Mikolov's ``ptb.{train,valid,test}.txt`` in directory ``path``).

    Each line is split on whitespace and ends with ``<eos>`` (as in Transformer-XL / AWD-LSTM).
    The vocab is built from train (10,000 words: 9,999 types, ``<unk>`` included, plus
    ``<eos>``), sorted by frequency then lexicographically.
    """
    d = _directory(path, "ptb", ", ".join(_PTB_FILES.values()))
    paths = _split_files(d, _PTB_FILES, "ptb")
    if paths is None:
        raise CorpusError(f"{d}: not a PTB directory: expected {', '.join(_PTB_FILES.values())}")
    return _word_corpus("ptb", d, paths)


def read_wikitext(path: PathLike) -> Corpus:
    """WikiText-2 / WikiText-103, word level (``wiki.{train,valid,test}.tokens`` in ``path``).

    As the Transformer-XL code does, every line, the empty ones included, is split on whitespace
    and ends with ``<eos>`` (so a blank line is a lone ``<eos>``). The vocab is built from train
    (``<unk>`` is already in the text), sorted by frequency then lexicographically.
    """
    d = _directory(path, "wikitext", ", ".join(_WIKITEXT_FILES.values()))
    paths = _split_files(d, _WIKITEXT_FILES, "wikitext")
    if paths is None:
        raise CorpusError(
            f"{d}: not a WikiText directory: expected {', '.join(_WIKITEXT_FILES.values())}"
        )
    return _word_corpus("wikitext", d, paths)


def read_ptb_char(path: PathLike) -> Corpus:
    """Penn Treebank, character level (Mikolov's ``ptb.char.*`` form), unit char, metric bpc.

    ``path`` is a directory with either ``ptb.char.{train,valid,test}.txt`` (read when present:
    each line's space-separated characters, ``_`` at word boundaries) or the word-level
    ``ptb.{train,valid,test}.txt`` (converted: each line's words joined with ``_``). Both give
    the same tokens: every line's characters followed by ``<eos>``. The vocab is the characters
    of train, sorted, then ``<eos>``; ``decode`` writes ``<eos>`` as a newline.
    """
    expected = f"{', '.join(_PTB_CHAR_FILES.values())} or {', '.join(_PTB_FILES.values())}"
    d = _directory(path, "ptb-char", expected)
    paths = _split_files(d, _PTB_CHAR_FILES, "ptb-char")
    from_char_files = paths is not None
    if paths is None:
        paths = _split_files(d, _PTB_FILES, "ptb-char")
    if paths is None:
        raise CorpusError(f"{d}: not a PTB directory: expected {expected}")
    logger.info("%s: ptb-char from %s files", d, "char" if from_char_files else "word")
    raws = {split: _read_file(p) for split, p in paths.items()}
    texts = {}
    for split, p in paths.items():
        text = _decode_text(raws[split], p)
        if not text.strip():
            raise CorpusError(f"{p}: empty split (no tokens)")
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        if from_char_files:
            out = []
            for lineno, line in enumerate(lines, 1):
                chars = line.split()
                joined = "".join(chars)
                if len(joined) != len(chars):
                    tok = next(c for c in chars if len(c) != 1)
                    raise CorpusError(
                        f"{p}: line {lineno}: token {tok!r} is not a single character "
                        "(not a ptb.char file)"
                    )
                out.append(joined)
        else:
            out = ["_".join(line.split()) for line in lines]
        texts[split] = "\n".join(out) + "\n"
    chars = sorted(set(texts["train"]) - {"\n"})
    vocab = Vocab(unit="char", tokens=(*chars, _EOS), eos=_EOS)
    ids = {}
    for split, text in texts.items():
        try:
            ids[split] = vocab._encode_chars(text)
        except CorpusError as e:
            raise CorpusError(f"{paths[split]}: {e}") from None
    corpus = Corpus(
        name="ptb-char",
        unit="char",
        vocab=vocab,
        train=ids["train"],
        valid=ids["valid"],
        test=ids["test"],
        fingerprint=_fingerprint(raws["train"], raws["valid"], raws["test"]),
        source=str(d),
    )
    logger.info("loaded %r", corpus)
    return corpus


def _is_hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def read_text(path: PathLike) -> Corpus:
    """Any UTF-8 text file, or a folder of them, byte level (vocab 256), split 90/5/5.

    A folder is read recursively: files sorted by relative path, hidden entries (names starting
    with ``.``) skipped, files that are not UTF-8 text (or contain NUL bytes) skipped with a
    logged warning. Files are concatenated as bytes, with a ``\\n`` inserted after a file that does
    not end with one. The split is contiguous: valid = test = ``n // 20`` bytes, train the rest.
    A single file that is not UTF-8 text raises :class:`CorpusError`.
    """
    p = Path(path)
    if not p.exists():
        raise CorpusError(
            f"{p}: no such file or directory (format 'text' expects a text file or folder)"
        )
    if p.is_file():
        raw = _read_file(p)
        _decode_text(raw, p)  # validates
        return _contiguous_corpus(
            name=f"text:{p.name}",
            unit="byte",
            vocab=Vocab.byte_level(),
            raw=raw,
            source=str(p),
            encode=_bytes_to_ids,
        )
    files = sorted(
        (f for f in p.rglob("*") if f.is_file() and not _is_hidden(f.relative_to(p))),
        key=lambda f: f.relative_to(p).as_posix(),
    )
    parts: list[bytes] = []
    for f in files:
        raw = _read_file(f)
        try:
            _decode_text(raw, f)
        except CorpusError as e:
            logger.warning("skipping %s", e)
            continue
        if parts and not parts[-1].endswith(b"\n"):
            parts.append(b"\n")
        parts.append(raw)
    if not parts:
        raise CorpusError(f"{p}: folder holds no UTF-8 text files ({len(files)} files seen)")
    return _contiguous_corpus(
        name=f"text:{p.name}",
        unit="byte",
        vocab=Vocab.byte_level(),
        raw=b"".join(parts),
        source=str(p),
        encode=_bytes_to_ids,
    )


_STDLIB_EXCLUDED = frozenset(
    {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
)


def embedded_corpus(max_bytes: int = 20_000_000) -> Corpus:
    """The default corpus: the running interpreter's standard-library ``.py`` sources, byte level.

    Read at run time from ``sysconfig.get_paths()["stdlib"]``: every ``.py`` file outside
    directories named ``site-packages``, ``dist-packages``, ``test``, ``tests``, ``idle_test`` or
    ``__pycache__`` (and hidden ones), sorted by relative path, each preceded by a line
    ``# ---- <relative path> ----`` and ending with a newline; the concatenation is cut at
    ``max_bytes`` (CPython 3.11 gives about 12 MB, so the default keeps all of it) and split
    90/5/5 contiguously. Name ``python-stdlib-<version>``; the fingerprint hashes the version and
    the content, so results can record which sources they saw.
    """
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 20:
        raise ValueError(f"max_bytes must be an int >= 20, got {max_bytes!r}")
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise CorpusError(f"{root}: the standard-library directory does not exist")
    rels: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [n for n in dirnames if n not in _STDLIB_EXCLUDED and not n.startswith(".")]
        base = Path(dirpath).relative_to(root)
        rels.extend((base / n).as_posix() for n in filenames if n.endswith(".py"))
    rels.sort()
    parts: list[bytes] = []
    total = 0
    for rel in rels:
        raw = _read_file(root / rel)
        chunk = f"# ---- {rel} ----\n".encode() + raw + (b"" if raw.endswith(b"\n") else b"\n")
        parts.append(chunk)
        total += len(chunk)
        if total >= max_bytes:
            break
    if not parts:
        raise CorpusError(f"{root}: no standard-library .py sources found")
    content = b"".join(parts)[:max_bytes]
    version = platform.python_version()
    return _contiguous_corpus(
        name=f"python-stdlib-{version}",
        unit="byte",
        vocab=Vocab.byte_level(),
        raw=content,
        source=f"{root} ({len(parts)} .py files, {len(content)} bytes)",
        encode=_bytes_to_ids,
        fingerprint=hashlib.sha256(f"python-{version}\0".encode() + content).hexdigest()[:16],
    )


_READERS: dict[str, Callable[[PathLike], Corpus]] = {
    "enwik8": read_enwik8,
    "text8": read_text8,
    "ptb": read_ptb,
    "ptb-char": read_ptb_char,
    "wikitext": read_wikitext,
    "text": read_text,
}
FORMATS: tuple[str, ...] = tuple(_READERS)


def load_corpus(path: PathLike, format: str) -> Corpus:
    """Read the corpus at ``path`` in ``format`` (one of :data:`FORMATS`)."""
    reader = _READERS.get(format)
    if reader is None:
        raise ValueError(f"unknown corpus format {format!r}; valid formats: {', '.join(FORMATS)}")
    return reader(path)
