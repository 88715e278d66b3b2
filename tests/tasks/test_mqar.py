"""MQAR (Zoology): the generator's layout, determinism per seed, answers recoverable from the
sequence alone, the registered task, and clear errors."""

from __future__ import annotations

import pytest
import torch

from effiformer import create_model
from effiformer.models.base import IGNORE_INDEX
from effiformer.tasks import get_task
from effiformer.tasks.mqar import (
    MQARTask,
    default_pairs,
    mqar_answers,
    mqar_batch,
    mqar_recall_positions,
)


def _batch(seed=0, rows=64, t=128, n=8, v=64):
    return mqar_batch(rows, t, n, v, torch.Generator().manual_seed(seed))


def test_pairs_grow_with_length_as_in_zoology():
    assert [default_pairs(t) for t in (64, 128, 256, 512, 1024)] == [4, 8, 16, 32, 64]


def test_layout_keys_values_and_one_query_per_key():
    x, y = _batch()
    n, half = 8, 32
    keys, values = x[:, 0:16:2], x[:, 1:16:2]
    assert ((keys >= 1) & (keys < half)).all() and ((values >= half) & (values < 64)).all()
    for r in range(x.shape[0]):  # distinct keys and values within a row
        assert len(set(keys[r].tolist())) == n and len(set(values[r].tolist())) == n
    scored = y != IGNORE_INDEX
    assert (scored.sum(1) == n).all()  # every key is queried once
    assert not scored[:, :16].any()  # nothing scored inside the pairs
    pos = scored.nonzero()[:, 1]
    assert ((pos - 16) % 2 == 0).all()  # queries at even offsets after the pairs
    # at each query the input is a key and the target that key's value
    for r, p in scored.nonzero().tolist():
        i = keys[r].tolist().index(int(x[r, p]))
        assert int(y[r, p]) == int(values[r, i])


def test_answers_are_recoverable_from_the_sequence_alone():
    x, y = _batch(seed=3, rows=200, t=256, n=16, v=256)
    answers = mqar_answers(x, 16)
    scored = y != IGNORE_INDEX
    assert torch.equal(answers[scored], y[scored])


def test_queries_mostly_come_soon_after_the_pairs_power_law():
    x, y = _batch(seed=1, rows=400, t=512, n=8, v=64)
    gaps = ((y != IGNORE_INDEX).nonzero()[:, 1] - 16) // 2
    space = (512 - 16) // 2
    # p(g) ~ g^-0.99: over half the queries in the first tenth of the space, yet some far out
    assert (gaps < space // 10).float().mean() > 0.5
    assert (gaps > space // 2).any()


def test_deterministic_per_seed_and_resumable_by_step():
    a, b = MQARTask(seq_len=64, seed=5), MQARTask(seq_len=64, seed=5)
    assert torch.equal(a.batch(7)[0], b.batch(7)[0]) and torch.equal(a.batch(7)[1], b.batch(7)[1])
    assert not torch.equal(a.batch(7)[0], a.batch(8)[0])
    assert not torch.equal(a.batch(7)[0], MQARTask(seq_len=64, seed=6).batch(7)[0])
    assert torch.equal(a.split("valid")[0], b.split("valid")[0])
    assert not torch.equal(a.split("valid")[0], a.split("test")[0])
    model = create_model("vanilla-tiny", seq_len=64, vocab_size=256)
    it = a.train_batches(model)
    next(it), next(it)
    state = a.state_dict()
    c = MQARTask(seq_len=64, seed=5)
    c.load_state_dict(state)
    assert torch.equal(next(c.train_batches(model)).data["input_ids"], next(it).data["input_ids"])
    with pytest.raises(ValueError, match="saved data position"):
        MQARTask(seq_len=128, seed=5).load_state_dict(state)


def test_a_perfect_recaller_scores_100_and_chance_is_low():
    task = MQARTask(seq_len=64, vocab_size=64, eval_sequences=32)

    class Oracle(torch.nn.Module):
        config = create_model("vanilla-tiny", seq_len=64, vocab_size=64).config

        def forward(self, x, targets=None):
            from effiformer.models.base import ModelOutput

            ans = mqar_answers(x, task.n_pairs)
            logits = torch.zeros(*x.shape, 64)
            logits.scatter_(2, ans.clamp(min=0).unsqueeze(-1), 10.0)
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, 64), targets.reshape(-1), ignore_index=IGNORE_INDEX
            )
            return ModelOutput(logits=logits, loss=loss)

    assert task.evaluate(Oracle())["accuracy"] == 1.0
    model = create_model("vanilla-tiny", seq_len=64, vocab_size=64)
    assert task.evaluate(model)["accuracy"] < 0.2


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="distinct keys"):
        MQARTask(seq_len=1024, vocab_size=64)  # 64 pairs, 31 keys
    with pytest.raises(ValueError, match="cannot hold"):
        MQARTask(seq_len=16, n_pairs=8)
    with pytest.raises(ValueError, match="power_a"):
        MQARTask(power_a=0)
    task = MQARTask(seq_len=128)
    with pytest.raises(ValueError, match="seq_len >= 128"):
        task.check_model(create_model("vanilla-tiny", seq_len=64, vocab_size=256))
    with pytest.raises(ValueError, match="vocab_size=256"):
        task.check_model(create_model("vanilla-tiny", seq_len=128, vocab_size=100))


def test_registered_task_builds_a_causal_model_sized_for_it():
    from effiformer.tasks import BuildContext
    from effiformer.tasks.registry import make_options

    spec = get_task("mqar")
    opts = make_options(spec.options, {"seq_len": 64, "vocab": 64, "batch": 4})
    setup = spec.build(opts, BuildContext(model_name="vanilla-tiny", seed=1))
    assert setup.model.config.vocab_size == 64 and setup.model.config.seq_len == 64
    assert setup.model.config.causal and setup.task.n_pairs == 4
    with pytest.raises(ValueError, match="causal=True"):
        spec.build(opts, BuildContext(model_name="vanilla-tiny", overrides=("causal=false",)))


def test_scoring_only_the_queries_changes_nothing_in_the_evaluation():
    """The task asks a model with ``scores_subset`` for the head at the queries only; accuracy,
    loss and sequence accuracy equal those of the full head."""
    from effiformer import create_model

    task = MQARTask(seq_len=64, vocab_size=64, batch_size=4, eval_sequences=12, eval_batch_size=5)
    torch.manual_seed(0)
    model = create_model("vanilla-tiny", vocab_size=64, seq_len=64)
    scored = task.evaluate(model)
    model.scores_subset = False  # the instance now takes the full head
    full = task.evaluate(model)
    assert scored["tokens"] == full["tokens"] > 0
    assert scored["accuracy"] == full["accuracy"]
    assert scored["sequence_accuracy"] == full["sequence_accuracy"]
    assert abs(scored["loss"] - full["loss"]) < 1e-5


def test_the_training_ladder_cycles_lengths_at_constant_tokens_and_evaluates_at_seq_len():
    """``train_min_len``: Zoology's several-configuration training. Step i is at the ladder's
    (i mod n)-th length with pairs T/16 and as many tokens as a full-length step; the answers
    stay recoverable; evaluation is at seq_len; the fingerprint names the ladder."""
    from effiformer.tasks.mqar import length_ladder

    assert length_ladder(None, 256) == (256,)
    assert length_ladder(64, 1024) == (64, 128, 256, 512, 1024)
    task = MQARTask(seq_len=256, vocab_size=1024, batch_size=2, train_min_len=64, eval_sequences=4)
    shapes = []
    for step in range(6):
        x, y = task.batch(step)
        shapes.append(tuple(x.shape))
        assert x.numel() == 2 * 256
        n = x.shape[1] // 16
        assert int((y != IGNORE_INDEX).sum()) == x.shape[0] * n
        assert torch.equal(mqar_answers(x, n)[y != IGNORE_INDEX], y[y != IGNORE_INDEX])
    assert shapes == [(8, 64), (4, 128), (2, 256)] * 2
    assert task.split("valid")[0].shape == (4, 256)
    plain = MQARTask(seq_len=256, vocab_size=1024, batch_size=2)
    assert plain.fingerprint() != task.fingerprint() and "train_min_len=64" in task.fingerprint()
    assert torch.equal(plain.batch(2)[0], task.batch(2)[0])  # full-length steps are the same data
    # each rank takes its share of every batch, whatever its rows
    model = create_model("vanilla-tiny", vocab_size=1024, seq_len=256)
    rows = [next(task.train_batches(model, rank=1, world=2)).data["input_ids"].shape]
    assert rows == [torch.Size([4, 64])]
    with pytest.raises(ValueError, match="train_min_len=48 must be seq_len=256 divided by a power"):
        MQARTask(seq_len=256, train_min_len=48)


def test_each_key_occurs_only_in_its_pair_and_its_query_unless_the_fill_may_hold_keys():
    """The random fill never repeats a row's keys (at 1,024 tokens and 256 symbols Zoology's
    fill holds 0.7 random copies of each queried key before its query, an ambiguity the task
    does not mean); ``fill_keys=True`` is Zoology's fill."""
    x, y = mqar_batch(16, 1024, 64, 256, torch.Generator().manual_seed(0))
    for r in range(16):
        keys = x[r, 0:128:2]
        counts = torch.bincount(x[r], minlength=256)[keys]
        assert torch.equal(counts, torch.full_like(counts, 2))
    assert torch.equal(mqar_answers(x, 64)[y != IGNORE_INDEX], y[y != IGNORE_INDEX])
    z, _ = mqar_batch(16, 1024, 64, 256, torch.Generator().manual_seed(0), fill_keys=True)
    copies = [
        int(torch.bincount(z[r], minlength=256)[z[r, 0:128:2]].sum()) - 128 for r in range(16)
    ]
    assert sum(copies) / (16 * 64) > 1.0  # about 832 fill tokens x 64/256 keys per row


def test_recall_positions_name_each_scored_query_and_the_value_after_its_key():
    task = MQARTask(seq_len=128, vocab_size=64, eval_sequences=8)
    x, y = task.split("test")
    pos = mqar_recall_positions(x, y, task.n_pairs)
    assert len(pos) == x.shape[0]
    for r, pairs in enumerate(pos):
        assert [q for q, _ in pairs] == (y[r] != IGNORE_INDEX).nonzero().flatten().tolist()
        for q, v in pairs:
            assert v % 2 == 1 and v < 2 * task.n_pairs <= q  # a value of the pairs, before q
            assert x[r, v - 1] == x[r, q]  # its key is the query token
            assert x[r, v] == y[r, q]  # and it is the answer
