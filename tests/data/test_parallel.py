"""Parallel corpora: aligned plain/gzip files, the Multi30k layout, the joint BPE vocabulary and
token-budget batches with exact resume."""

import gzip
from pathlib import Path

import numpy as np
import pytest

from effiformer.data import (
    ParallelData,
    ParallelDataError,
    TokenBatcher,
    read_lines,
    read_parallel,
    train_joint_tokenizer,
)

EN = ["A man rides a bike.", "Two dogs play in the snow!", "A girl, smiling, reads."]
DE = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee!", "Ein Mädchen liest lächelnd."]


def _write(path: Path, lines, *, gz=False):
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture
def folder(tmp_path):
    _write(tmp_path / "train.en.gz", EN * 20, gz=True)
    _write(tmp_path / "train.de.gz", DE * 20, gz=True)
    _write(tmp_path / "val.en", EN)
    _write(tmp_path / "val.de", DE)
    _write(tmp_path / "test_2016_flickr.en.gz", EN[:2], gz=True)
    _write(tmp_path / "test_2016_flickr.de.gz", DE[:2], gz=True)
    _write(tmp_path / "mono.en", EN)  # no German side: not a split
    return tmp_path


def test_plain_and_gzip_files_read_the_same(tmp_path):
    a = _write(tmp_path / "a.txt", DE)
    b = _write(tmp_path / "b.txt", DE, gz=True)  # gzip told by its bytes, not its name
    assert read_lines(a) == read_lines(b) == DE
    weird = tmp_path / "w.txt"
    weird.write_text("one\u2028still one\r\n  two  \n", encoding="utf-8")
    assert read_lines(weird) == ["one\u2028still one", "two"]


def test_misaligned_files_are_refused_naming_both_files_and_counts(tmp_path):
    src = _write(tmp_path / "x.en", EN)
    tgt = _write(tmp_path / "x.de.gz", DE[:2], gz=True)
    with pytest.raises(ParallelDataError) as e:
        read_parallel(src, tgt)
    msg = str(e.value)
    assert str(src) in msg and str(tgt) in msg and "3 lines" in msg and "has 2" in msg


def test_empty_lines_are_refused_with_their_line_numbers_or_skipped(tmp_path):
    src = _write(tmp_path / "x.en", [EN[0], "", EN[2]])
    tgt = _write(tmp_path / "x.de", [DE[0], DE[1], "  "])
    with pytest.raises(ParallelDataError, match=r"2 empty line\(s\).*line 2, 3"):
        read_parallel(src, tgt)
    s, t = read_parallel(src, tgt, empty="skip")
    assert s == [EN[0]] and t == [DE[0]]


def test_bad_files_get_clear_errors(tmp_path):
    with pytest.raises(ParallelDataError, match="no such file"):
        read_lines(tmp_path / "missing.en")
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"fine\n\xff\xfe broken\n")
    with pytest.raises(ParallelDataError, match="line 2 is not valid UTF-8"):
        read_lines(bad)
    trunc = tmp_path / "t.gz"
    trunc.write_bytes(gzip.compress(b"x" * 1000)[:20])
    with pytest.raises(ParallelDataError, match="gzip"):
        read_lines(trunc)


def test_folder_layout_any_split_either_direction(folder):
    en_de = ParallelData(folder, "en", "de")
    assert en_de.splits() == ["test_2016_flickr", "train", "val"]
    val = en_de.split("val")
    assert val.src == EN and val.tgt == DE and len(val) == 3
    de_en = ParallelData(folder, "de", "en").split("val")
    assert de_en.src == DE and de_en.tgt == EN
    assert de_en.fingerprint != val.fingerprint
    with pytest.raises(ParallelDataError, match="no split 'test'.*test_2016_flickr, train, val"):
        en_de.split("test")
    with pytest.raises(ParallelDataError, match="no split 'mono'"):
        en_de.split("mono")
    with pytest.raises(ValueError, match="different languages"):
        ParallelData(folder, "en", "en")


def test_joint_bpe_vocabulary_round_trips_text(folder, tmp_path):
    train = ParallelData(folder, "en", "de").split("train")
    tok = train_joint_tokenizer(train, vocab_size=300, min_frequency=1)
    for text in [*EN, *DE, "Ein Mann, Zwei Hunde.", "Fährt  der Mann!"]:
        assert tok.decode(tok.encode_ids([text])[0]) == text
    # A character never seen in training ("z" here) has no subword: it becomes [UNK].
    assert tok.decode(tok.encode_ids(["zwei"])[0]) == "wei"
    assert tok.bos_id == 2 and tok.eos_id == 3 and tok.pad_id == 0
    path = tok.save(tmp_path / "tok")
    from effiformer.data.tokenizer import SubwordTokenizer

    again = SubwordTokenizer.load(path)
    assert again.encode_ids(DE) == tok.encode_ids(DE)
    assert again.to_bytes() == tok.to_bytes()


def _lengths(n=200, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(2, 40, n).tolist(), rng.integers(2, 45, n).tolist()


def test_token_batches_respect_the_budget_and_cover_every_pair_once():
    src, tgt = _lengths()
    b = TokenBatcher(src, tgt, 300, seed=1)
    for epoch in (0, 1):
        batches = b.batches(epoch)
        seen = np.concatenate(batches)
        assert sorted(seen.tolist()) == list(range(200))
        for idx in batches:
            width = max(max(src[i], tgt[i]) for i in idx)
            assert width * len(idx) <= 300
    assert [x.tolist() for x in b.batches(0)] != [x.tolist() for x in b.batches(1)]
    again = TokenBatcher(src, tgt, 300, seed=1)
    assert [x.tolist() for x in again.batches(1)] == [x.tolist() for x in b.batches(1)]
    fixed = TokenBatcher(src, tgt, 300, shuffle=False)
    lens = [src[i] for i in np.concatenate(fixed.batches(0))]
    assert lens == sorted(lens)  # evaluation order: by source length
    capped = TokenBatcher(src, tgt, 10_000, max_sentences=7)
    assert max(len(x) for x in capped.batches(0)) == 7


def test_token_batcher_resumes_exactly_and_refuses_other_settings():
    src, tgt = _lengths()
    a = TokenBatcher(src, tgt, 400, seed=3)
    n = len(a)
    for _ in range(n + 2):  # into the second epoch
        next(a)
    state = a.state_dict()
    assert state["epoch"] == 1 and state["position"] == 2
    expected = [next(a).tolist() for _ in range(5)]
    b = TokenBatcher(src, tgt, 400, seed=3)
    b.load_state_dict(state)
    assert [next(b).tolist() for _ in range(5)] == expected
    with pytest.raises(ValueError, match="max_tokens"):
        TokenBatcher(src, tgt, 500, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="lengths"):
        TokenBatcher(src[::-1], tgt, 400, seed=3).load_state_dict(state)
    with pytest.raises(ValueError, match="more than max_tokens=30"):
        TokenBatcher(src, tgt, 30)


def test_multi30k_splits_read_aligned(shared_data):
    d = ParallelData(shared_data("multi30k"), "en", "de")
    assert {"train", "val", "test_2016_flickr"} <= set(d.splits())
    val = d.split("val")
    assert len(val) == 1014 and all(val.src) and all(val.tgt)
    assert val.tgt[0].startswith("Eine Gruppe von Männern")
