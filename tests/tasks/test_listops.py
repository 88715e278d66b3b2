"""ListOps: labels equal an independent evaluator of the printed expression on thousands of samples,
lengths and tokens as documented, determinism per seed, the registered task, clear errors."""

from __future__ import annotations

import random

import pytest
import torch

from effiformer.tasks import get_task
from effiformer.tasks.listops import (
    CLS,
    LISTOPS_VOCAB,
    PAD,
    ListOpsTask,
    decode,
    evaluate_expression,
    generate_expression,
    listops_batch,
)


def test_labels_equal_an_independent_evaluator_on_thousands_of_samples():
    ids, mask, labels = listops_batch(3000, random.Random(0), min_len=16, max_len=128)
    for r in range(ids.shape[0]):
        tokens = decode(ids[r])
        assert evaluate_expression(tokens) == int(labels[r])
    # every class occurs, and every operator is used
    assert set(labels.tolist()) == set(range(10))
    used = {LISTOPS_VOCAB[i] for i in ids.unique().tolist()}
    assert {"[MAX", "[MIN", "[MED", "[SM", "]"} <= used


def test_evaluator_by_hand():
    assert evaluate_expression("[MAX 2 9 [MIN 4 7 ] 0 ]".split()) == 9
    assert evaluate_expression("[SM 1 [MED 3 8 6 ] 2 [MIN 4 9 ] ]".split()) == 3
    assert evaluate_expression("[MED 1 2 3 4 ]".split()) == 2  # median 2.5 truncated
    with pytest.raises(ValueError, match="unbalanced"):
        evaluate_expression("[MAX 1 2".split())


def test_lengths_brackets_cls_and_padding():
    ids, mask, _ = listops_batch(200, random.Random(1), min_len=40, max_len=80)
    assert ids.shape == (200, 81) and (ids[:, 0] == CLS).all()
    n = mask.sum(1) - 1  # expression tokens
    assert ((n >= 40) & (n <= 80)).all()
    assert ((ids == PAD) == (mask == 0)).all()
    # brackets are tokens: as many closing brackets as operators
    ops = sum((ids == LISTOPS_VOCAB.index(o)).sum() for o in ("[MAX", "[MIN", "[MED", "[SM"))
    assert int(ops) == int((ids == LISTOPS_VOCAB.index("]")).sum())


def test_depth_limit_is_respected():
    rng = random.Random(2)
    for _ in range(300):
        tokens, _ = generate_expression(rng, min_len=4, max_len=400, max_depth=3)
        depth = best = 0
        for t in tokens:
            depth += t.startswith("[")
            depth -= t == "]"
            best = max(best, depth)
        assert best <= 3


def test_deterministic_per_seed():
    a, b = ListOpsTask(max_len=64, seed=3), ListOpsTask(max_len=64, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.batch(5), b.batch(5), strict=True))
    assert not torch.equal(a.batch(5)[0], a.batch(6)[0])
    assert not torch.equal(a.split("valid")[0], ListOpsTask(max_len=64, seed=4).split("valid")[0])


def test_registered_task_trains_an_encoder_classifier():
    from effiformer.tasks import BuildContext
    from effiformer.tasks.registry import make_options
    from effiformer.train import TrainConfig, train

    spec = get_task("listops")
    opts = make_options(spec.options, {"max_len": 32, "batch": 8, "eval_sequences": 16})
    setup = spec.build(opts, BuildContext(model_name="vanilla-tiny"))
    assert not setup.model.config.causal and setup.model.config.seq_len == 33
    hist = train(setup.model, setup.task, TrainConfig(steps=3, eval_every=3, progress=False,
                                                      device="cpu", warmup=1))  # fmt: skip
    ev = hist.evals[-1]
    assert 0.0 <= ev["val_accuracy"] <= 1.0 and 0.0 < ev["val_majority_accuracy"] < 0.5
    funnel = spec.build(opts, BuildContext(model_name="funnel-tiny")).model
    assert type(funnel).__name__ == "FunnelForSequenceClassification"


def test_bad_input_is_one_clear_error():
    with pytest.raises(ValueError, match="min_len"):
        ListOpsTask(max_len=32, min_len=64)
    with pytest.raises(ValueError, match="widen the length range"):
        generate_expression(random.Random(0), min_len=5, max_len=5, max_depth=1, max_args=2)
    from effiformer import create_model

    task = ListOpsTask(max_len=32)
    with pytest.raises(ValueError, match="bidirectional"):
        task.check_model(create_model("vanilla-tiny", vocab_size=17))


def test_training_position_resumes_exactly_and_refuses_other_data():
    from effiformer import create_model

    model = create_model("vanilla-tiny", causal=False, vocab_size=17, seq_len=65)
    a = ListOpsTask(max_len=64, batch_size=4, seed=2)
    it = a.train_batches(model)
    next(it), next(it)
    b = ListOpsTask(max_len=64, batch_size=4, seed=2)
    b.load_state_dict(a.state_dict())
    assert torch.equal(next(b.train_batches(model)).data["labels"], next(it).data["labels"])
    with pytest.raises(ValueError, match="saved data position"):
        ListOpsTask(max_len=64, batch_size=4, seed=3).load_state_dict(a.state_dict())
