"""torch.export of the decoder-only models whose forward has no data-dependent branch: the
exported program gives the eager logits; the token-id range check stays in eager (a clear
error) and is skipped while tracing, where reading a tensor's values would break the graph
(issue 24 lists it as what broke export of every model)."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("name", ["vanilla-tiny", "routing-tiny", "xl-tiny", "sparse-tiny"])
def test_export_gives_the_eager_logits(name):
    torch.manual_seed(0)
    model = create_model(name).eval()
    ids = torch.randint(0, 50, (2, 32), generator=torch.Generator().manual_seed(1))
    program = torch.export.export(model, (ids,))
    out = program.module()(ids)
    assert_close(out.logits, model(ids).logits, rtol=0, atol=0)
    other = torch.randint(0, 50, (2, 32), generator=torch.Generator().manual_seed(2))
    assert_close(program.module()(other).logits, model(other).logits, rtol=0, atol=0)


def test_the_token_range_check_still_speaks_in_eager():
    model = create_model("vanilla-tiny").eval()
    with pytest.raises(ValueError, match=r"token id 300 is outside the vocabulary \[0, 256\)"):
        model(torch.tensor([[1, 300]]))
    with pytest.raises(ValueError, match=r"target ids must be in \[0, 256\)"):
        model(torch.tensor([[1, 2]]), targets=torch.tensor([[1, 999]]))


def test_the_trainer_checks_ids_on_the_host_before_an_accelerator():
    """On a GPU run the model does not read ids (a host sync per forward): the trainer checks
    each batch on the host before moving it, here called as it is."""
    from effiformer.tasks.base import Batch
    from effiformer.train import check_batch_ids

    good = Batch({"input_ids": torch.tensor([[0, 255]])})
    check_batch_ids(good, 256)
    check_batch_ids(good, None)  # a model without a vocabulary: nothing to check
    with pytest.raises(ValueError, match=r"token id 256 in a training batch is outside the "
                       r"model's vocabulary \[0, 256\)"):  # fmt: skip
        check_batch_ids(Batch({"input_ids": torch.tensor([[1, 256]])}), 256)
    with pytest.raises(ValueError, match="token id -3"):
        check_batch_ids(Batch({"input_ids": torch.tensor([[-3, 2]])}), 256)
