"""Funnel pooling: length rule, mean/max values, stride-sliced side structures, pad-mask polarity,
upsampling."""

import math

import pytest
import torch
from torch.testing import assert_close

from effiformer.layers.pooling import (
    pool_padding,
    pool_positions,
    pool_sequence,
    pooled_length,
    stride_slice,
    upsample,
)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 16, 17, 512])
def test_length_rule_matches_the_paper_formula(n):
    x = torch.randn(1, n, 3)
    assert pool_sequence(x).shape[1] == pooled_length(n) == 1 + math.ceil((n - 2) / 2)
    no_trunc = pool_sequence(x, truncate_seq=False).shape[1]
    assert no_trunc == pooled_length(n, truncate_seq=False) == 1 + math.ceil((n - 1) / 2)
    no_cls = pool_sequence(x, separate_cls=False).shape[1]
    assert no_cls == pooled_length(n, separate_cls=False) == math.ceil(n / 2)


def test_lengths_512_256_128_and_9_5_3():
    for n, expect in ((512, [256, 128]), (9, [5, 3])):
        lengths = []
        for _ in range(2):
            n = pooled_length(n)
            lengths.append(n)
        assert lengths == expect


def test_mean_and_max_pool_pairs_and_keep_cls_apart():
    x = torch.arange(9.0).view(1, 9, 1) ** 2  # values 0, 1, 4, 9, ...
    v = x[0, :, 0]
    # separate_cls + truncate: [CLS] alone, pairs (1,2), (3,4), (5,6), (7) ; token 8 dropped
    want_mean = torch.stack([v[0], (v[1] + v[2]) / 2, (v[3] + v[4]) / 2, (v[5] + v[6]) / 2, v[7]])
    assert_close(pool_sequence(x, "mean")[0, :, 0], want_mean)
    want_max = torch.stack([v[0], v[2], v[4], v[6], v[7]])
    assert_close(pool_sequence(x, "max")[0, :, 0], want_max)
    # without separate_cls: (0,1), (2,3), ... , (8)
    want = torch.stack(
        [(v[0] + v[1]) / 2, (v[2] + v[3]) / 2, (v[4] + v[5]) / 2, (v[6] + v[7]) / 2, v[8]]
    )
    assert_close(pool_sequence(x, "mean", separate_cls=False)[0, :, 0], want)


def test_pooled_slot_zero_is_the_cls_state():
    x = torch.randn(2, 10, 4)
    for mode in ("mean", "max"):
        assert_close(pool_sequence(x, mode)[:, 0], x[:, 0], rtol=0, atol=0)


def test_positions_are_stride_sliced_never_averaged_and_cls_goes_to_1_minus_2b():
    pos = torch.arange(8)
    p1 = pool_positions(pos, 1)
    assert p1.tolist() == [-1, 1, 3, 5]
    p2 = pool_positions(p1, 2)
    assert p2.tolist() == [-3, 1]
    # evenly spaced at the block's stride: what the relative shift relies on
    assert (p1[1:] - p1[:-1]).eq(2).all()
    assert pool_positions(torch.arange(9), 1, truncate_seq=False).tolist() == [-1, 1, 3, 5, 7]
    assert pool_positions(pos, 1, separate_cls=False).tolist() == [0, 2, 4, 6]


def test_stride_slice_keeps_the_first_of_each_window_along_any_dim():
    m = torch.arange(64).view(8, 8)
    rows = stride_slice(m, 0)
    assert_close(rows, m[[0, 1, 3, 5]])
    cols = stride_slice(m, 1)
    assert_close(cols, m[:, [0, 1, 3, 5]])


def test_pad_mask_pooling_follows_the_official_polarity_on_a_straddling_window():
    # keep-mask, True = real. Tokens 0..5 real, 6.. padding. Windows (1,2) (3,4) (5,6) (7,8).
    keep = torch.tensor([[1, 1, 1, 1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    pooled = pool_padding(keep)
    # window (5,6) straddles: official (min over is-pad) keeps it; window (7,8) is all padding
    assert pooled.tolist() == [[True, True, True, True, False]]
    # HF's polarity (min over the keep-mask) would drop the straddling window: they differ here
    hf = pool_sequence(keep.to(torch.uint8), "min").bool()
    assert hf.tolist() == [[True, True, True, False, False]]
    assert not torch.equal(pooled, hf)


def test_upsample_repeats_windows_keeps_cls_and_zero_fills_truncated_tail():
    x = torch.arange(1.0, 5.0).view(1, 4, 1)  # [CLS]=1, slots 2, 3, 4
    up = upsample(x, 2, 8)
    assert up[0, :, 0].tolist() == [1, 2, 2, 3, 3, 4, 4, 0]
    up4 = upsample(x[:, :2], 4, 8)
    assert up4[0, :, 0].tolist() == [1, 2, 2, 2, 2, 0, 0, 0]
    no_cls = upsample(x, 2, 7, separate_cls=False, truncate_seq=False)
    assert no_cls[0, :, 0].tolist() == [1, 1, 2, 2, 3, 3, 4]


def test_bad_mode_is_rejected():
    with pytest.raises(ValueError, match="pooling mode"):
        pool_sequence(torch.randn(1, 4, 2), "median")


def test_positions_as_integers_follow_the_pooled_tensors():
    """Funnel's positions stay evenly spaced through every pooling, so (first, step, count)
    describes them: the integer form equals pool_positions, and the distance table built from
    the integers equals the one read from the tensors."""
    import torch

    from effiformer.attention.funnel_relative import progression_distances, relative_distances
    from effiformer.layers.pooling import pool_positions, pool_progression

    for n in range(1, 40):
        for sep in (True, False):
            for trunc in (True, False):
                pos, prog = torch.arange(n), (0, 1, n)
                for b in range(1, 4):
                    if pos.numel() <= (2 if sep else 1):
                        break
                    new = pool_positions(pos, b, separate_cls=sep, truncate_seq=trunc)
                    new_prog = pool_progression(*prog, b, separate_cls=sep, truncate_seq=trunc)
                    first, step, count = new_prog
                    assert torch.equal(new, first + step * torch.arange(count)), (n, sep, trunc, b)
                    for q, qp, k, kp, shift in ((new, new_prog, pos, prog, 2),
                                                (new, new_prog, new, new_prog, 1)):  # fmt: skip
                        assert torch.equal(
                            progression_distances(qp[0], kp[0], kp[1], qp[2], kp[2], shift),
                            relative_distances(q, k, shift),
                        )
                    pos, prog = new, new_prog
