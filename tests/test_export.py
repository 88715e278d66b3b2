"""effiformer.export: the encoder and incremental decoder-step programs of the encoder-decoders
(dense Transformer, Lite's LSRA, a HAT SubTransformer) and the one program of a language model
give eager's outputs at batches, beams and lengths other than the example's, an empty cache
included; ONNX files run in onnxruntime give the same; what cannot export says why; the command
line writes and refuses as documented. Below them, ``torch.export.export`` of the decoder-only
models' plain forward (no data-dependent branch: the token-id range check stays in eager, a
clear error, and is skipped while tracing, where reading a tensor's values would break the
graph; issue 24 lists it as what broke export of every model)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close

from effiformer import create_model, save_model
from effiformer.cli import main as cli
from effiformer.export import (
    ExportError,
    check_translation,
    export_language_model,
    export_translation,
    program_length,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _seq2seq(name: str):
    torch.manual_seed(0)
    if name == "hat":
        from effiformer.models.hat import export_subtransformer

        sup = create_model("hat-tiny").eval()
        sub = sup.config.space.sample(torch.Generator().manual_seed(3))
        return export_subtransformer(sup, sub).eval()
    if name == "lite-tiny":  # dynamic convolutions, attention + convolution branches
        return create_model("lite-tiny").eval()
    if name == "lite-multi30k":  # lightweight (shared) convolutions
        return create_model(name, vocab_size=300, dim=64, ffn_dim=64).eval()
    return create_model(name, vocab_size=300, dim=32, ffn_dim=64).eval()


def _sources(cfg, b=3, s=9, seed=5):
    src = torch.randint(4, cfg.vocab_size, (b, s), generator=torch.Generator().manual_seed(seed))
    src[:, -1] = cfg.eos_id
    src[1, 5], src[1, 6:] = cfg.eos_id, cfg.pad_id  # a padded sentence
    return src


@torch.no_grad()
def _eager_greedy(model, src, n):
    cfg = model.config
    state = model.init_decoding_state(model.encode(src))
    tokens = torch.full((src.shape[0], 1), cfg.bos_id)
    done = torch.zeros(src.shape[0], dtype=torch.bool)
    out = []
    for _ in range(n):
        o = model.decode_step(tokens, state)
        state = o.state
        nxt = o.logits[:, -1].argmax(-1).masked_fill(done, cfg.pad_id)
        out.append(nxt)
        done |= nxt == cfg.eos_id
        tokens = nxt[:, None]
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("name", ["transformer-multi30k", "lite-multi30k", "lite-tiny", "hat"])
def test_translation_programs_decode_as_eager(name):
    model = _seq2seq(name)
    exp = export_translation(model)  # example: 2 sentences of 7 tokens, a cache of 3
    src = _sources(model.config)  # 3 sentences of 9, one padded; the cache starts empty
    with torch.no_grad():
        memory = exp.encoder.module()(src)
        state = model.init_decoding_state(model.encode(src))
        step = exp.decoder_step.module()
        cache = exp.empty_cache(3)
        assert all(t.shape[0] == 3 for t in cache)
        tokens = torch.full((3, 1), model.config.bos_id)
        for _ in range(6):  # every step's log-probabilities and the caches it returns
            out = model.decode_step(tokens, state)
            state = out.state
            logp, *cache = step(tokens, *memory, *cache)
            assert_close(logp, torch.log_softmax(out.logits[:, -1], -1), rtol=1e-5, atol=1e-5)
            tokens = logp.argmax(-1, keepdim=True)
    # and greedy decoding driven by the programs alone
    got = exp.greedy(src, 10)
    assert torch.equal(got, _eager_greedy(model, src, got.shape[1]))


def test_a_beam_program_takes_beam_rows_per_sentence():
    model = _seq2seq("transformer-multi30k")
    exp = export_translation(model, beam=4)
    assert exp.beam == 4
    assert check_translation(model, exp) < 1e-5  # 3 sentences x 4 rows, 6 steps
    with pytest.raises(ExportError, match="greedy decoding needs programs exported with beam=1"):
        exp.greedy(_sources(model.config), 3)
    with pytest.raises(ValueError, match="beam must be a positive int"):
        export_translation(model, beam=0)


def test_language_model_program_takes_any_batch_and_length():
    torch.manual_seed(0)
    model = create_model("vanilla-tiny").eval()
    prog = export_language_model(model)  # example (2, 16)
    assert program_length(prog) is None  # not specialized to the example's length
    for shape in [(1, 5), (3, 40)]:
        ids = torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(shape[1]))
        with torch.no_grad():
            assert_close(prog.module()(ids), model(ids).logits, rtol=0, atol=0)


def test_the_reformer_exports_for_its_length_and_draws_rotations_per_call():
    """LSH's chunked kernel is a registered operator, so the Reformer exports; its chunk counts
    come from the length, so the program is for ``seq_len`` tokens. Its rotations are drawn from
    the global RNG inside the program, per call, as in eager: same seed, same logits."""
    model = create_model("reformer-tiny").eval()
    prog = export_language_model(model)
    L = program_length(prog)
    assert L == model.config.seq_len
    ids = torch.randint(0, 50, (3, L), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(5)
    got = prog.module()(ids)
    torch.manual_seed(5)
    with torch.no_grad():
        assert_close(got, model(ids).logits, rtol=0, atol=0)
    torch.manual_seed(6)
    assert not torch.equal(prog.module()(ids), got)  # other rotations, other buckets


def test_what_cannot_export_says_why():
    # adaptive span trims its keys to a learned length: data-dependent by design
    with pytest.raises(ExportError, match="cannot be exported: GuardOnDataDependentSymNode"):
        export_language_model(create_model("adaptive-span-tiny").eval())
    with pytest.raises(ExportError, match="eval mode"):
        export_translation(create_model("seq2seq-tiny").train())
    with pytest.raises(ExportError, match="not an encoder-decoder"):
        export_translation(create_model("vanilla-tiny").eval())
    # a decoder state without a key/value cache: nothing to read the decoded length from
    from effiformer.attention.lsra import LSRAState
    from effiformer.export import _Layout

    with pytest.raises(ExportError, match="keeps no key/value cache"):
        _Layout.of((LSRAState(attn=None, conv=torch.zeros(2, 3, 4)),))


def test_cli_writes_pt2_and_onnx_and_refuses_a_used_folder(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    lm = create_model("vanilla-tiny").eval()
    save_model(lm, tmp_path / "lm")
    assert cli(["export", str(tmp_path / "lm"), "--out", str(tmp_path / "lm-pt2")]) == 0
    info = json.loads((tmp_path / "lm-pt2" / "export.json").read_text())
    assert info["kind"] == "language_model" and info["max_abs_diff"] == 0.0
    prog = torch.export.load(str(tmp_path / "lm-pt2" / "model.pt2"))
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert_close(prog.module()(ids), lm(ids).logits, rtol=0, atol=0)

    mt = _seq2seq("transformer-multi30k")
    save_model(mt, tmp_path / "mt")
    out = tmp_path / "mt-onnx"
    assert cli(["export", str(tmp_path / "mt"), "--format", "onnx", "--beam", "2",
                "--out", str(out)]) == 0  # fmt: skip
    info = json.loads((out / "export.json").read_text())
    assert info["kind"] == "translation" and info["beam"] == 2
    assert info["max_abs_diff"] < 1e-5 and info["onnxruntime_max_abs_diff"] < 1e-5
    assert len(info["decoder_step_inputs"]) == 1 + len(info["encoder_outputs"]) + len(
        info["cache_shapes"]
    )
    import onnxruntime as ort

    sess = ort.InferenceSession(str(out / "decoder_step.onnx"))
    assert [i.name for i in sess.get_inputs()][0] == "tokens"
    assert "exported" in capsys.readouterr().out
    before = sorted(p.name for p in out.iterdir())
    assert cli(["export", str(tmp_path / "mt"), "--out", str(out)]) == 2
    assert "holds an export already" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before  # nothing overwritten


# ---- the models' own forward under torch.export (formerly tests/test_export.py)


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
