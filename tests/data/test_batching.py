"""Contiguous, shuffled-window and evaluation batching of :mod:`effiformer.data.batching`."""

from __future__ import annotations

import pytest
import torch

from effiformer.data import CorpusError, StreamBatcher, WindowBatcher, eval_batches


def _stream(n: int, seed: int = 0) -> torch.Tensor:
    """Random token ids, shape (n,), so a misplaced slice cannot match by accident."""
    return torch.randint(0, 1000, (n,), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# StreamBatcher
# ---------------------------------------------------------------------------------------------


def test_stream_batches_are_contiguous_streams() -> None:
    data = _stream(103)
    b, t = 4, 5
    batcher = StreamBatcher(data, batch_size=b, seq_len=t)
    streams = data[:100].view(b, 25)  # 3 tail tokens dropped; each stream holds 25 tokens
    assert len(batcher) == (25 - 1) // t == 4
    batches = [next(batcher) for _ in range(len(batcher))]
    for i, (x, y) in enumerate(batches):
        assert x.shape == y.shape == (b, t) and x.dtype == y.dtype == torch.int64
        torch.testing.assert_close(x, streams[:, i * t : i * t + t])
        torch.testing.assert_close(y, streams[:, i * t + 1 : i * t + t + 1])
    for (_, y_prev), (x_next, _) in zip(batches, batches[1:]):
        # row b of batch t+1 starts with the token that row b of batch t was predicting last
        torch.testing.assert_close(x_next[:, 0], y_prev[:, -1])
    xs = torch.cat([x for x, _ in batches], dim=1)  # (B, 20)
    ys = torch.cat([y for _, y in batches], dim=1)
    torch.testing.assert_close(xs, streams[:, :20])
    torch.testing.assert_close(ys, streams[:, 1:21])
    torch.testing.assert_close(xs.reshape(-1)[:20], data[:20])  # row 0 is the stream's start


def test_stream_batcher_wraps_to_a_new_epoch() -> None:
    batcher = StreamBatcher(_stream(64), batch_size=2, seq_len=7)
    assert len(batcher) == 4
    first = [next(batcher) for _ in range(4)]
    assert (batcher.epoch, batcher.position) == (1, 0)
    again = [next(batcher) for _ in range(4)]
    for (x0, y0), (x1, y1) in zip(first, again):
        torch.testing.assert_close(x0, x1)
        torch.testing.assert_close(y0, y1)
    x2, y2 = batcher.batch(2)
    torch.testing.assert_close(x2, first[2][0])
    torch.testing.assert_close(y2, first[2][1])


@pytest.mark.parametrize(
    "make",
    [
        lambda d: StreamBatcher(d, batch_size=3, seq_len=4),
        lambda d: WindowBatcher(d, batch_size=3, seq_len=4, seed=17),
    ],
    ids=["stream", "window"],
)
def test_resume_continues_exactly(make) -> None:
    data = _stream(200)
    reference = make(data)
    expected = [next(reference) for _ in range(40)]  # crosses several epoch boundaries
    for k in (0, 5, len(reference), 23):
        run = make(data)
        for _ in range(k):
            next(run)
        state = run.state_dict()
        resumed = make(data.clone())
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state
        for i in range(k, 40):
            x, y = next(resumed)
            torch.testing.assert_close(x, expected[i][0])
            torch.testing.assert_close(y, expected[i][1])


def test_load_state_dict_checks_the_configuration() -> None:
    batcher = StreamBatcher(_stream(100), batch_size=2, seq_len=4)
    other = StreamBatcher(_stream(100), batch_size=2, seq_len=5)
    with pytest.raises(ValueError, match="seq_len=5 but this batcher has seq_len=4"):
        batcher.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="keys"):
        batcher.load_state_dict({"epoch": 0, "position": 0})
    with pytest.raises(ValueError, match=r"position must be in \[0, 12\), got 12"):
        batcher.load_state_dict({**batcher.state_dict(), "position": 12})
    windows = WindowBatcher(_stream(100), batch_size=2, seq_len=4, seed=1)
    with pytest.raises(ValueError, match="seed=2 but this batcher has seed=1"):
        windows.load_state_dict({**windows.state_dict(), "seed": 2})


# ---------------------------------------------------------------------------------------------
# WindowBatcher
# ---------------------------------------------------------------------------------------------


def test_window_batcher_epoch_is_a_permutation_of_windows() -> None:
    data = _stream(83)
    b, t = 3, 4
    batcher = WindowBatcher(data, batch_size=b, seq_len=t, seed=0)
    num_windows = (83 - 1) // t  # 20
    assert len(batcher) == num_windows // b == 6
    windows = torch.stack([data[w * t : w * t + t + 1] for w in range(num_windows)])  # (W, T+1)
    for epoch in (0, 1):
        perm = batcher.permutation(epoch)
        assert sorted(perm.tolist()) == list(range(num_windows))
        for i in range(len(batcher)):
            x, y = next(batcher)
            assert x.shape == y.shape == (b, t)
            chosen = windows[perm[i * b : (i + 1) * b]]  # (B, T+1)
            torch.testing.assert_close(x, chosen[:, :-1])
            torch.testing.assert_close(y, chosen[:, 1:])
    assert not torch.equal(batcher.permutation(0), batcher.permutation(1))


def test_window_batcher_is_deterministic_in_seed_and_epoch() -> None:
    data = _stream(500)
    a = WindowBatcher(data, batch_size=4, seq_len=8, seed=3)
    b = WindowBatcher(data, batch_size=4, seq_len=8, seed=3)
    c = WindowBatcher(data, batch_size=4, seq_len=8, seed=4)
    xs_a = torch.stack([next(a)[0] for _ in range(30)])  # two epochs of 15 batches
    xs_b = torch.stack([next(b)[0] for _ in range(30)])
    xs_c = torch.stack([next(c)[0] for _ in range(30)])
    torch.testing.assert_close(xs_a, xs_b)
    assert not torch.equal(xs_a, xs_c)
    x, _ = a.batch(7, epoch=1)
    torch.testing.assert_close(x, xs_a[15 + 7])


# ---------------------------------------------------------------------------------------------
# eval_batches
# ---------------------------------------------------------------------------------------------


def test_eval_batches_cover_the_split() -> None:
    data = _stream(23)
    streams = data[:22].view(2, 11)
    batches = list(eval_batches(data, batch_size=2, seq_len=4))
    assert [x.shape for x, _ in batches] == [(2, 4), (2, 4), (2, 2)]
    torch.testing.assert_close(torch.cat([x for x, _ in batches], dim=1), streams[:, :-1])
    torch.testing.assert_close(torch.cat([y for _, y in batches], dim=1), streams[:, 1:])
    single = list(eval_batches(data, batch_size=1, seq_len=5))
    torch.testing.assert_close(torch.cat([y for _, y in single], dim=1), data[1:].view(1, -1))
    torch.testing.assert_close(torch.cat([x for x, _ in single], dim=1), data[:-1].view(1, -1))


# ---------------------------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------------------------


def test_too_short_data_names_the_sizes() -> None:
    assert len(StreamBatcher(_stream(4 * 6), batch_size=4, seq_len=5)) == 1
    with pytest.raises(CorpusError, match="23 tokens.*batch_size=4.*at least 24 tokens"):
        StreamBatcher(_stream(23), batch_size=4, seq_len=5)
    assert len(WindowBatcher(_stream(4 * 5 + 1), batch_size=4, seq_len=5, seed=0)) == 1
    with pytest.raises(CorpusError, match="20 tokens.*batch_size=4.*seq_len=5.*at least 21"):
        WindowBatcher(_stream(20), batch_size=4, seq_len=5, seed=0)
    with pytest.raises(CorpusError, match="7 tokens.*batch_size=4.*at least 8"):
        eval_batches(_stream(7), batch_size=4, seq_len=5)


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="1-D integer tensor.*float32"):
        StreamBatcher(torch.zeros(50), batch_size=2, seq_len=4)
    with pytest.raises(ValueError, match=r"1-D integer tensor.*\(5, 10\)"):
        eval_batches(torch.zeros(5, 10, dtype=torch.long), batch_size=2, seq_len=4)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        WindowBatcher(_stream(50), batch_size=0, seq_len=4, seed=0)
    with pytest.raises(ValueError, match="seq_len must be a positive int"):
        StreamBatcher(_stream(50), batch_size=2, seq_len=2.5)  # type: ignore[arg-type]
    with pytest.raises(IndexError, match=r"\[0, 6\)"):
        StreamBatcher(_stream(50), batch_size=2, seq_len=4).batch(6)
