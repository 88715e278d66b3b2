"""Readers, vocabularies and errors of :mod:`effiformer.data.corpora` on small real-format fixtures."""

from __future__ import annotations

import hashlib
import logging
import pickle
import zipfile
from pathlib import Path

import pytest
import torch

from effiformer.data import (
    FORMATS,
    Corpus,
    CorpusError,
    Vocab,
    embedded_corpus,
    load_corpus,
    read_ptb,
    read_ptb_char,
    read_text,
    read_wikitext,
)
from effiformer.data.corpora import _split_sizes


def _ids(values: list[int] | bytes) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64)


def _sha16(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _write_zip(path: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(member, data)
    return path


def _splits(corpus: Corpus) -> list[torch.Tensor]:
    return [corpus.train, corpus.valid, corpus.test]


# ---------------------------------------------------------------------------------------------
# byte / char corpora
# ---------------------------------------------------------------------------------------------

ENWIK8_BYTES = (
    b'<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/">\n  <page>\n'
    + "  <title>Caf\u00e9 \u2014 \u6f22\u5b57</title>\n".encode()
    + bytes(range(256))
    + b"  </page>\n</mediawiki>\n"
) * 3  # 1,083 bytes: train 975, valid 54, test 54


def _check_enwik8(corpus: Corpus, source_suffix: str) -> None:
    n = len(ENWIK8_BYTES)
    k = n // 20
    assert (corpus.name, corpus.unit, corpus.metric) == ("enwik8", "byte", "bpc")
    assert corpus.vocab == Vocab.byte_level() and corpus.vocab.size == 256
    torch.testing.assert_close(corpus.train, _ids(ENWIK8_BYTES[: n - 2 * k]))
    torch.testing.assert_close(corpus.valid, _ids(ENWIK8_BYTES[n - 2 * k : n - k]))
    torch.testing.assert_close(corpus.test, _ids(ENWIK8_BYTES[n - k :]))
    assert corpus.fingerprint == _sha16(ENWIK8_BYTES)
    assert corpus.source.endswith(source_suffix)


def test_enwik8_raw_file_zip_and_directory(tmp_path: Path) -> None:
    raw = tmp_path / "raw" / "enwik8"
    raw.parent.mkdir()
    raw.write_bytes(ENWIK8_BYTES)
    zipped = _write_zip(tmp_path / "enwik8.zip", "enwik8", ENWIK8_BYTES)
    zip_dir = tmp_path / "zipdir"
    zip_dir.mkdir()
    _write_zip(zip_dir / "enwik8.zip", "enwik8", ENWIK8_BYTES)
    _check_enwik8(load_corpus(raw, "enwik8"), "raw/enwik8")
    _check_enwik8(load_corpus(raw.parent, "enwik8"), "raw/enwik8")
    _check_enwik8(load_corpus(str(zipped), "enwik8"), "enwik8.zip!enwik8")
    _check_enwik8(load_corpus(zip_dir, "enwik8"), "zipdir/enwik8.zip!enwik8")


def test_standard_split_sizes_of_the_full_corpora() -> None:
    assert _split_sizes(100_000_000, "enwik8") == (90_000_000, 5_000_000, 5_000_000)
    assert _split_sizes(20, "tiny") == (18, 1, 1)
    with pytest.raises(CorpusError, match="tiny.*19 units.*at least 20"):
        _split_sizes(19, "tiny")


TEXT8 = (
    b"anarchism originated as a term of abuse first used against early working class radicals " * 4
)


def test_text8_zip(tmp_path: Path) -> None:
    corpus = load_corpus(_write_zip(tmp_path / "text8.zip", "text8", TEXT8), "text8")
    assert (corpus.name, corpus.unit, corpus.metric) == ("text8", "char", "bpc")
    alphabet = sorted(set(TEXT8.decode()))
    assert corpus.vocab.tokens == tuple(alphabet)
    n, k = len(TEXT8), len(TEXT8) // 20
    expected = _ids([alphabet.index(chr(c)) for c in TEXT8])
    torch.testing.assert_close(corpus.train, expected[: n - 2 * k])
    torch.testing.assert_close(corpus.valid, expected[n - 2 * k : n - k])
    torch.testing.assert_close(corpus.test, expected[n - k :])
    assert "".join(corpus.vocab.decode(s) for s in _splits(corpus)) == TEXT8.decode()
    assert corpus.fingerprint == _sha16(TEXT8)
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "text8").write_bytes(TEXT8)
    plain = load_corpus(tmp_path / "plain", "text8")
    for a, b in zip(_splits(plain), _splits(corpus)):
        torch.testing.assert_close(a, b)


def test_text_file_and_folder(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    single = tmp_path / "poem.txt"
    single.write_text("Shall I compare thee to a summer\u2019s day?\n" * 5, encoding="utf-8")
    corpus = load_corpus(single, "text")
    raw = single.read_bytes()
    assert (corpus.unit, corpus.metric, corpus.vocab.size) == ("byte", "bpc", 256)
    torch.testing.assert_close(torch.cat(_splits(corpus)), _ids(raw))
    assert [s.numel() for s in _splits(corpus)] == [
        len(raw) - 2 * (len(raw) // 20),
        len(raw) // 20,
        len(raw) // 20,
    ]
    assert corpus.fingerprint == _sha16(raw)

    folder = tmp_path / "folder"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_bytes(b"second file, no final newline")
    (folder / "a.md").write_bytes("# first file \u00e9\n".encode())
    (folder / "sub" / "c.txt").write_bytes(b"third file in a subfolder\n" * 3)
    (folder / "blob.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    (folder / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (folder / ".hidden").write_bytes(b"never read")
    with caplog.at_level(logging.WARNING, logger="effiformer.data.corpora"):
        corpus = read_text(folder)
    expected = (
        "# first file \u00e9\n".encode()
        + b"second file, no final newline"
        + b"\n"
        + b"third file in a subfolder\n" * 3
    )
    torch.testing.assert_close(torch.cat(_splits(corpus)), _ids(expected))
    assert corpus.fingerprint == _sha16(expected)
    assert corpus.vocab.decode(torch.cat(_splits(corpus))) == expected.decode()
    warned = caplog.text
    assert "blob.bin" in warned and "latin1.txt" in warned and ".hidden" not in warned


# ---------------------------------------------------------------------------------------------
# word corpora
# ---------------------------------------------------------------------------------------------

PTB_TRAIN = " the cat sat on the mat \n the dog sat \n a <unk> ran N miles \n"
PTB_VALID = " the cat ran \n a tad sat \n"  # "tad" is not in train -> <unk>
PTB_TEST = " the mat \n"


def _write_ptb(directory: Path, train: str = PTB_TRAIN) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for split, text in (("train", train), ("valid", PTB_VALID), ("test", PTB_TEST)):
        (directory / f"ptb.{split}.txt").write_text(text, encoding="utf-8")
    return directory


def test_ptb_directory(tmp_path: Path) -> None:
    corpus = load_corpus(_write_ptb(tmp_path / "ptb"), "ptb")
    assert (corpus.name, corpus.unit, corpus.metric) == ("ptb", "word", "ppl")
    # counts: <eos> 3, the 3, sat 2, then count-1 words in lexicographic order
    assert corpus.vocab.tokens == (
        "<eos>", "the", "sat", "<unk>", "N", "a", "cat", "dog", "mat", "miles", "on", "ran",
    )  # fmt: skip
    assert (corpus.vocab.unk, corpus.vocab.eos) == ("<unk>", "<eos>")
    tok = corpus.vocab.token_to_id
    train_words = "the cat sat on the mat <eos> the dog sat <eos> a <unk> ran N miles <eos>"
    torch.testing.assert_close(corpus.train, _ids([tok[w] for w in train_words.split()]))
    valid_words = "the cat ran <eos> a <unk> sat <eos>"
    torch.testing.assert_close(corpus.valid, _ids([tok[w] for w in valid_words.split()]))
    torch.testing.assert_close(corpus.test, _ids([tok[w] for w in "the mat <eos>".split()]))
    assert corpus.vocab.decode(corpus.valid) == "the cat ran\na <unk> sat\n"
    torch.testing.assert_close(corpus.vocab.encode(corpus.vocab.decode(corpus.train)), corpus.train)
    parts = [(tmp_path / "ptb" / f"ptb.{s}.txt").read_bytes() for s in ("train", "valid", "test")]
    digests = b"".join(hashlib.sha256(p).digest() for p in parts)
    assert corpus.fingerprint == _sha16(digests)


def test_word_vocab_is_deterministic(tmp_path: Path) -> None:
    lines = PTB_TRAIN.splitlines(keepends=True)
    a = read_ptb(_write_ptb(tmp_path / "a"))
    b = read_ptb(_write_ptb(tmp_path / "b", train="".join(reversed(lines))))
    assert a.vocab == b.vocab
    assert Vocab.from_json(a.vocab.to_json()) == a.vocab


def test_wikitext_keeps_every_line(tmp_path: Path) -> None:
    d = tmp_path / "wikitext-2"
    d.mkdir()
    train = " \n = Valkyria Chronicles = \n \n Senjō no Valkyria 3 @-@ <unk> \n"
    (d / "wiki.train.tokens").write_text(train, encoding="utf-8")
    (d / "wiki.valid.tokens").write_text(" = Valkyria = \n", encoding="utf-8")
    (d / "wiki.test.tokens").write_text(" Senjō 3", encoding="utf-8")  # no final newline
    corpus = read_wikitext(d)
    assert (corpus.name, corpus.unit, corpus.metric) == ("wikitext", "word", "ppl")
    tok = corpus.vocab.token_to_id
    words = "<eos> = Valkyria Chronicles = <eos> <eos> Senjō no Valkyria 3 @-@ <unk> <eos>"
    torch.testing.assert_close(corpus.train, _ids([tok[w] for w in words.split()]))
    torch.testing.assert_close(corpus.valid, _ids([tok[w] for w in "= Valkyria = <eos>".split()]))
    torch.testing.assert_close(corpus.test, _ids([tok[w] for w in "Senjō 3 <eos>".split()]))
    assert corpus.vocab.tokens[:3] == ("<eos>", "=", "Valkyria")
    assert corpus.vocab.decode(corpus.train) == (
        "\n= Valkyria Chronicles =\n\nSenjō no Valkyria 3 @-@ <unk>\n"
    )


PTB_CHAR_EXPECTED = [
    "the_cat_sat_on_the_mat",
    "the_dog_sat",
    "a_<unk>_ran_N_miles",
]


def test_ptb_char_from_word_files_and_from_char_files(tmp_path: Path) -> None:
    derived = read_ptb_char(_write_ptb(tmp_path / "words"))
    char_dir = tmp_path / "chars"
    char_dir.mkdir()
    for split, text in (("train", PTB_TRAIN), ("valid", PTB_VALID), ("test", PTB_TEST)):
        # Mikolov's format: characters separated by spaces, "_" between words.
        lines = [" ".join("_".join(line.split())) for line in text.splitlines()]
        (char_dir / f"ptb.char.{split}.txt").write_text(
            "".join(f" {line} \n" for line in lines), encoding="utf-8"
        )
    from_chars = load_corpus(char_dir, "ptb-char")
    for corpus in (derived, from_chars):
        assert (corpus.name, corpus.unit, corpus.metric) == ("ptb-char", "char", "bpc")
        chars = sorted(set("".join(PTB_CHAR_EXPECTED)))
        assert corpus.vocab.tokens == (*chars, "<eos>")
        assert corpus.vocab.eos == "<eos>"
        tok = corpus.vocab.token_to_id
        expected = [tok[c] for line in PTB_CHAR_EXPECTED for c in [*line, "<eos>"]]
        torch.testing.assert_close(corpus.train, _ids(expected))
        assert corpus.vocab.decode(corpus.valid) == "the_cat_ran\na_tad_sat\n"
        torch.testing.assert_close(
            corpus.vocab.encode(corpus.vocab.decode(corpus.test)), corpus.test
        )
    for a, b in zip(_splits(derived), _splits(from_chars)):
        torch.testing.assert_close(a, b)


def test_real_ptb_vocab_and_token_counts(shared_data) -> None:
    """The real PTB (the shared_data fixture: skipped without it, an error in CI)."""
    real_ptb = shared_data("ptb")
    ptb = load_corpus(real_ptb, "ptb")
    assert ptb.vocab.size == 10_000  # 9,999 word types (with <unk>) + <eos>
    assert ptb.vocab.tokens[:3] == ("the", "<unk>", "<eos>")
    assert [s.numel() for s in _splits(ptb)] == [929_589, 73_760, 82_430]
    assert ptb.vocab.decode(ptb.train[:4]) == "aer banknote berlitz calloway"
    char = load_corpus(real_ptb, "ptb-char")
    assert char.vocab.size == 50  # 49 characters ("_" included) + <eos>
    assert [s.numel() for s in _splits(char)] == [5_017_482, 393_042, 442_423]
    assert char.vocab.decode(char.train[:20]) == "aer_banknote_berlitz"


# ---------------------------------------------------------------------------------------------
# Vocab
# ---------------------------------------------------------------------------------------------


def test_vocab_encode_decode_round_trips() -> None:
    byte = Vocab.byte_level()
    text = "naïve café ✓ 漢字\n"
    torch.testing.assert_close(byte.encode(text), _ids(text.encode()))
    assert byte.decode(byte.encode(text)) == text
    assert Vocab.from_json(byte.to_json()) == byte

    char = Vocab(unit="char", tokens=("a", "é", "✓", "<eos>"), eos="<eos>")
    torch.testing.assert_close(char.encode("aé\n✓"), _ids([0, 1, 3, 2]))
    torch.testing.assert_close(char.encode("aa\na"), _ids([0, 0, 3, 0]))  # ASCII fast path
    assert char.decode(_ids([0, 1, 3, 2])) == "aé\n✓"
    assert Vocab.from_json(char.to_json()) == char

    word = Vocab(unit="word", tokens=("<eos>", "the", "<unk>"), unk="<unk>", eos="<eos>")
    assert pickle.loads(pickle.dumps(word)) == word
    torch.testing.assert_close(word.encode("the zebra\nthe"), _ids([1, 2, 0, 1]))
    torch.testing.assert_close(word.encode(["the", "<eos>", "dog"]), _ids([1, 0, 2]))
    assert Vocab.from_json(word.to_json()) == word


def test_vocab_unknown_token_without_unk_names_it() -> None:
    word = Vocab(unit="word", tokens=("the", "cat"))
    with pytest.raises(CorpusError, match="'zebra'"):
        word.encode("the zebra")
    char = Vocab(unit="char", tokens=("a", "b"))
    with pytest.raises(CorpusError, match="'c'"):
        char.encode("abc")
    with pytest.raises(CorpusError, match="'ü'"):
        char.encode("abü")


def test_vocab_rejects_bad_definitions_and_ids() -> None:
    with pytest.raises(ValueError, match="twice"):
        Vocab(unit="word", tokens=("a", "b", "a"))
    with pytest.raises(ValueError, match="whitespace"):
        Vocab(unit="word", tokens=("a b",))
    with pytest.raises(ValueError, match="not one character"):
        Vocab(unit="char", tokens=("ab",))
    with pytest.raises(ValueError, match="unit"):
        Vocab(unit="bpe", tokens=("a",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="id 7 at position 1"):
        Vocab(unit="word", tokens=("a", "b")).decode([0, 7])
    with pytest.raises(ValueError, match="keys"):
        Vocab.from_json('{"unit": "byte"}')


# ---------------------------------------------------------------------------------------------
# embedded corpus
# ---------------------------------------------------------------------------------------------


def test_embedded_corpus_loads_and_is_stable() -> None:
    a = embedded_corpus()
    b = embedded_corpus()
    assert a.name.startswith("python-stdlib-3.") and a.unit == "byte" and a.metric == "bpc"
    assert a.train.numel() > 1_000_000 and a.valid.numel() > 0 and a.test.numel() > 0
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 16
    for x, y in zip(_splits(a), _splits(b)):
        torch.testing.assert_close(x, y)
    assert a.vocab.decode(a.train[:30]).startswith("# ---- ")
    small = embedded_corpus(max_bytes=4_000)
    assert sum(s.numel() for s in _splits(small)) == 4_000
    torch.testing.assert_close(small.train, a.train[: small.train.numel()])
    assert small.fingerprint != a.fingerprint


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------


def test_unknown_format_lists_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match="'ptb-word'.*enwik8, text8, ptb, ptb-char, wikitext, text"
    ):
        load_corpus(tmp_path, "ptb-word")
    assert FORMATS == ("enwik8", "text8", "ptb", "ptb-char", "wikitext", "text")


@pytest.mark.parametrize("fmt", FORMATS)
def test_missing_path_names_it(tmp_path: Path, fmt: str) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(CorpusError, match=f"{missing}: no such"):
        load_corpus(missing, fmt)


def _bad_inputs(tmp_path: Path) -> list[tuple[str, Path, str]]:
    """(format, path, what the message must contain) for each bad input."""
    cases = []
    empty_dir = tmp_path / "empty_dir"
    empty_dir.mkdir()
    cases.append(("ptb", empty_dir, f"{empty_dir}: not a PTB directory: expected ptb.train.txt"))
    cases.append(("ptb-char", empty_dir, f"{empty_dir}: not a PTB directory"))
    cases.append(("wikitext", empty_dir, f"{empty_dir}: not a WikiText directory"))
    cases.append(("enwik8", empty_dir, "neither 'enwik8' nor 'enwik8.zip'"))

    incomplete = _write_ptb(tmp_path / "incomplete")
    (incomplete / "ptb.test.txt").unlink()
    cases.append(
        ("ptb", incomplete, f"{incomplete}: incomplete 'ptb' directory, missing ptb.test.txt")
    )

    empty_split = _write_ptb(tmp_path / "empty_split")
    (empty_split / "ptb.valid.txt").write_text(" \n\n", encoding="utf-8")
    cases.append(("ptb", empty_split, f"{empty_split / 'ptb.valid.txt'}: empty split"))

    latin1 = _write_ptb(tmp_path / "latin1")
    (latin1 / "ptb.train.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    cases.append(("ptb", latin1, f"{latin1 / 'ptb.train.txt'}: not UTF-8 text"))

    bad_char = tmp_path / "bad_char"
    bad_char.mkdir()
    for split in ("train", "valid", "test"):
        (bad_char / f"ptb.char.{split}.txt").write_text("a b _ c d\n", encoding="utf-8")
    (bad_char / "ptb.char.valid.txt").write_text("a b _ cd\n", encoding="utf-8")
    cases.append(("ptb-char", bad_char, "ptb.char.valid.txt: line 1: token 'cd'"))

    file_not_dir = _write_ptb(tmp_path / "file_not_dir") / "ptb.train.txt"
    cases.append(("ptb", file_not_dir, f"{file_not_dir}: is a file"))

    wrong_zip = _write_zip(tmp_path / "wrong.zip", "text8", TEXT8)
    cases.append(("enwik8", wrong_zip, f"{wrong_zip}: zip archive has no member 'enwik8'"))

    other_dir = tmp_path / "other_dir"
    other_dir.mkdir()
    (other_dir / "text8").write_bytes(TEXT8)
    cases.append(("enwik8", other_dir, f"{other_dir}: directory holds neither 'enwik8' nor"))

    not_text8 = tmp_path / "not_text8"
    not_text8.write_bytes(b"this is fine until Here " * 2)
    cases.append(("text8", not_text8, f"{not_text8}: not text8: byte b'H' at offset 19"))

    empty = tmp_path / "enwik8"
    empty.write_bytes(b"")
    cases.append(("enwik8", empty, f"{empty}: empty corpus"))

    tiny = tmp_path / "tiny.txt"
    tiny.write_bytes(b"too small")
    cases.append(("text", tiny, f"{tiny}: corpus of 9 units is too small"))

    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x00\x01\x02binary")
    cases.append(("text", binary, f"{binary}: not a text file"))

    no_text = tmp_path / "no_text"
    no_text.mkdir()
    (no_text / "x.bin").write_bytes(b"\xff\xfe\x00")
    cases.append(("text", no_text, f"{no_text}: folder holds no UTF-8 text files"))

    no_unk = tmp_path / "no_unk"
    no_unk.mkdir()
    (no_unk / "wiki.train.tokens").write_text(" the cat \n", encoding="utf-8")
    (no_unk / "wiki.valid.tokens").write_text(" the zebra \n", encoding="utf-8")
    (no_unk / "wiki.test.tokens").write_text(" the cat \n", encoding="utf-8")
    cases.append(("wikitext", no_unk, f"{no_unk / 'wiki.valid.tokens'}: word 'zebra'"))
    return cases


def test_bad_inputs_raise_corpus_error_naming_the_path(tmp_path: Path) -> None:
    cases = _bad_inputs(tmp_path)
    for fmt, path, expected in cases:
        with pytest.raises(CorpusError) as info:
            load_corpus(path, fmt)
        assert expected in str(info.value), (fmt, path, str(info.value))
    assert len(cases) == 17
