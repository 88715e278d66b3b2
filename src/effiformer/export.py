"""Export for inference: ``torch.export`` programs (``.pt2``) and ONNX files of trained models.

A decoder-only language model exports as one program, ``ids (B, T) -> logits (B, T, V)``, with
the batch and the length dynamic. An encoder-decoder (``seq2seq``/``transformer-*``,
``lite-*``, a HAT SubTransformer) exports as the two programs a translation server runs
(Vaswani et al.'s incremental decoding, as :func:`effiformer.generation.beam_search` does it):

- ``encoder``: ``src_ids (B, S) -> memory``: the flat tensors of every decoder layer's
  projected encoder output (keys and values, once per sentence) and the source padding mask;
- ``decoder_step``: ``(tokens (R, 1), *memory, *cache) -> (log-probabilities (R, V), *cache')``:
  one incremental step for R = B x beam rows; ``cache`` is the flat tensors of every decoder
  layer's self-attention state (key/value caches, and a Lite convolution's last K - 1 inputs),
  empty before the first token (:meth:`TranslationExport.empty_cache`).

Sentences, rows, source length and the cache length are dynamic dimensions, so one program
serves every batch, beam and length up to the model's ``seq_len``. The positions an incremental
step needs (how many tokens came before) are read from the cache's length, never a Python int
baked into the graph. :meth:`TranslationExport.greedy` decodes with the programs alone (what a
runtime does), and the tests check programs, ONNX files and that decoding against eager.

``effiformer export RUN --format pt2|onnx --out DIR`` writes ``DIR/encoder.pt2`` and
``DIR/decoder_step.pt2`` (or ``model.pt2``; ``.onnx`` likewise) and ``DIR/export.json``: the
inputs and outputs in order with their shapes, the special token ids and the source run.
ONNX goes through ``torch.onnx.export(..., dynamo=True)`` and needs ``onnx`` and ``onnxscript``
(the ``export`` extra; ``onnxruntime`` runs the check).

Not exportable, each with a :class:`ExportError` that says why: models whose forward has a
data-dependent branch (Reformer's LSH, Funnel's fused core with ``out=`` buffers; any other
failure of ``torch.export`` is reported the same way, with its first line), and decoder self-attention states without a key/value cache to read the
position from (a convolution-only Lite layer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .ops.tracing import general_path

__all__ = [
    "ExportError",
    "LanguageModelStep",
    "TranslationExport",
    "export_language_model",
    "export_translation",
    "export_run",
    "program_length",
]

#: Field names of the Python ints in decoding states that count the positions decoded so far:
#: set from the cache's (symbolic) length inside a program.
LENGTH_FIELDS = ("length", "seen")
ROW_FIELDS = ("rows",)


class ExportError(ValueError):
    """A model (or a part of it) that cannot be exported, and why (a user's request that cannot
    be met: the command line reports it in one line)."""


# ---- a small pytree over decoding states ---------------------------------------------------


def _leaves(obj: Any, path: tuple = ()) -> list[tuple[tuple, Any]]:
    """(path, leaf) of every tensor, int and None in a nest of tuples, lists and dataclasses."""
    if isinstance(obj, Tensor) or obj is None or isinstance(obj, (bool, int, float, str)):
        return [(path, obj)]
    if isinstance(obj, (tuple, list)) and not hasattr(obj, "_fields"):
        out = []
        for i, v in enumerate(obj):
            out += _leaves(v, path + (i,))
        return out
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = []
        for f in dataclasses.fields(obj):
            out += _leaves(getattr(obj, f.name), path + (f.name,))
        return out
    return [(path, obj)]  # a constant (for example the SubTransformer a HAT state decodes)


def _rebuild(obj: Any, values: dict[tuple, Any], path: tuple = ()) -> Any:
    if path in values:
        return values[path]
    if isinstance(obj, (tuple, list)) and not hasattr(obj, "_fields"):
        return type(obj)(_rebuild(v, values, path + (i,)) for i, v in enumerate(obj))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        kw = {f.name: _rebuild(getattr(obj, f.name), values, path + (f.name,))
              for f in dataclasses.fields(obj) if f.init}  # fmt: skip
        return type(obj)(**kw)
    return obj


def _name(path: tuple) -> str:
    return ".".join(str(p) for p in path)


@dataclass
class _Layout:
    """Where each tensor of a decoding state goes: ``memory`` (per sentence: encoder keys and
    values, masks), ``cache`` (per row: self-attention states); ``kv``: the cache paths of
    key/value tensors (their dim 2 is the decoded length); ``lengths``/``rows``: int fields
    set from the cache length and the number of rows."""

    template: Any
    memory: list[tuple] = field(default_factory=list)
    cache: list[tuple] = field(default_factory=list)
    kv: list[tuple] = field(default_factory=list)
    lengths: list[tuple] = field(default_factory=list)
    rows: list[tuple] = field(default_factory=list)

    @classmethod
    def of(cls, state: Any) -> _Layout:
        lay = cls(template=state)
        for path, leaf in _leaves(state):
            names = [p for p in path if isinstance(p, str)]
            in_cache = "self_attn" in names
            if isinstance(leaf, Tensor):
                (lay.cache if in_cache else lay.memory).append(path)
                if in_cache and names[-1] in ("k", "v") and leaf.dim() == 4:
                    lay.kv.append(path)
            elif isinstance(leaf, int) and not isinstance(leaf, bool) and names:
                if names[-1] in LENGTH_FIELDS:
                    lay.lengths.append(path)
                elif names[-1] in ROW_FIELDS:
                    lay.rows.append(path)
            elif leaf is None and names and names[-1].endswith("mask"):
                raise ExportError(
                    f"the decoding state's {_name(path)} is None where a program needs a tensor "
                    "(build the example state under ops.tracing.general_path())"
                )
        if not lay.kv:
            raise ExportError(
                "the decoder's self-attention keeps no key/value cache to read the decoded "
                "length from (a convolution-only layer?): such a model cannot be exported as "
                "an incremental decoder step"
            )
        return lay

    def state(self, tokens: Tensor, memory: tuple, cache: tuple) -> Any:
        values = dict(zip(self.memory, memory))
        values.update(zip(self.cache, cache))
        length = values[self.kv[0]].shape[2]
        values.update({p: length for p in self.lengths})
        values.update({p: tokens.shape[0] for p in self.rows})
        return _rebuild(self.template, values)


# ---- programs ------------------------------------------------------------------------------


class _Encoder(nn.Module):
    def __init__(self, model: nn.Module, layout: _Layout) -> None:
        super().__init__()
        self.model, self.layout = model, layout

    def forward(self, src_ids: Tensor) -> tuple[Tensor, ...]:
        enc = self.model.encode(src_ids)
        state = self.model.init_decoding_state(enc, rows_per_sentence=1)
        values = dict(_leaves(state))
        return tuple(values[p] for p in self.layout.memory)


class _DecoderStep(nn.Module):
    def __init__(self, model: nn.Module, layout: _Layout) -> None:
        super().__init__()
        self.model, self.layout = model, layout
        self.n_memory = len(layout.memory)

    def forward(self, tokens: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
        memory, cache = tensors[: self.n_memory], tensors[self.n_memory :]
        state = self.layout.state(tokens, memory, cache)
        out = self.model.decode_step(tokens, state)
        values = dict(_leaves(out.state))
        logp = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        return (logp, *(values[p] for p in self.layout.cache))


class LanguageModelStep(nn.Module):
    """``ids (B, T) -> logits (B, T, V)`` of a decoder-only model (no state)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor) -> Tensor:
        return self.model(ids).logits


@contextlib.contextmanager
def _explained(family: str):
    """torch.export's failures as an :class:`ExportError` naming the model family and the first
    line of the reason."""
    try:
        yield
    except ExportError:
        raise
    except Exception as e:  # torch.export raises many kinds; the user needs one line
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ExportError(
            f"this {family} model cannot be exported: {type(e).__name__}: {first}"
        ) from e


def _check_exportable(model: nn.Module) -> None:
    if model.training:
        raise ExportError("export a model in eval mode (model.eval()): dropout would be traced")


def export_language_model(
    model: nn.Module, *, example_len: int = 16
) -> torch.export.ExportedProgram:
    """The program ``ids (B, T) -> logits`` of a decoder-only or encoder-only ``model`` (eval
    mode), B dynamic and T dynamic (up to ``seq_len``) where the model allows it. A model whose
    structure is computed from the length (Funnel-Transformer: its pooled lengths and
    relative-position tables are Python integers; the Reformer: its chunk counts) is exported
    for ``T = seq_len`` (:func:`program_length` tells; pad the inputs to it)."""
    _check_exportable(model)
    cfg = model.config
    batch = torch.export.Dim("batch", min=1, max=1024)

    def ids_of(length: int) -> Tensor:
        ids = torch.randint(
            0, cfg.vocab_size, (2, length), generator=torch.Generator().manual_seed(0)
        )
        return ids.to(next(model.parameters()).device)

    dims = {"ids": {0: batch, 1: torch.export.Dim("length", min=1, max=cfg.seq_len)}}
    step = LanguageModelStep(model)
    with torch.no_grad(), _explained(cfg.family):
        try:
            return torch.export.export(step, (ids_of(example_len),), dynamic_shapes=dims)
        except Exception as dynamic_failed:
            # the length is part of the model's structure (Funnel's pooled lengths, LSH's chunk
            # counts): one program for one length, or the first failure if that fails too
            try:
                return torch.export.export(
                    step, (ids_of(cfg.seq_len),), dynamic_shapes={"ids": {0: batch}}
                )
            except Exception:
                raise dynamic_failed from None


def program_length(program: torch.export.ExportedProgram) -> int | None:
    """The sequence length a language-model program was specialized to (None: any length)."""
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name == "ids":
            t = node.meta.get("val")
            n = None if t is None else t.shape[1]
            return n if isinstance(n, int) else None
    return None


@dataclass
class TranslationExport:
    """The two programs of an encoder-decoder and what a runtime needs to drive them."""

    encoder: torch.export.ExportedProgram
    decoder_step: torch.export.ExportedProgram
    memory_names: list[str]
    cache_names: list[str]
    cache_shapes: list[tuple[str, ...]]  # per cache tensor: ("rows", "length", ...) symbols
    empty_cache_example: list[Tensor]  # the empty cache of ``rows=1``
    beam: int
    bos_id: int
    eos_id: int
    pad_id: int
    seq_len: int

    def empty_cache(self, rows: int) -> list[Tensor]:
        """The self-attention states before the first token, for ``rows`` decoder rows."""
        return [t.expand(rows, *t.shape[1:]).clone() for t in self.empty_cache_example]

    @torch.no_grad()
    def greedy(self, src_ids: Tensor, max_len: int) -> Tensor:
        """Greedy decoding with the programs alone (exported with ``beam=1``): ``src_ids``
        (B, S) -> (B, <= max_len) ids after BOS (EOS included where it came; pad after)."""
        if self.beam != 1:
            raise ExportError(
                f"greedy decoding needs programs exported with beam=1, not {self.beam}"
            )
        memory = self.encoder.module()(src_ids)
        step = self.decoder_step.module()
        b = src_ids.shape[0]
        cache = self.empty_cache(b)
        tokens = torch.full((b, 1), self.bos_id, dtype=torch.long, device=src_ids.device)
        out, done = [], torch.zeros(b, dtype=torch.bool, device=src_ids.device)
        for _ in range(min(max_len, self.seq_len - 1)):
            logp, *cache = step(tokens, *memory, *cache)
            nxt = logp.argmax(-1).masked_fill(done, self.pad_id)
            out.append(nxt)
            done = done | (nxt == self.eos_id)
            tokens = nxt[:, None]
            if bool(done.all()):
                break
        return torch.stack(out, dim=1)


def export_translation(
    model: nn.Module, *, beam: int = 1, example_src_len: int = 7
) -> TranslationExport:
    """The encoder and incremental decoder-step programs of an encoder-decoder ``model`` (eval
    mode) for ``beam`` decoder rows per sentence (the rows of a sentence stay together,
    sentence-major, as :func:`~effiformer.generation.beam_search` keeps them); see the module
    docstring."""
    if isinstance(beam, bool) or not isinstance(beam, int) or beam < 1:
        raise ValueError(f"beam must be a positive int, got {beam!r}")
    _check_exportable(model)
    if not hasattr(model, "decode_step"):
        raise ExportError(f"{type(model).__name__} is not an encoder-decoder (no decode_step)")
    cfg = model.config
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(0)
    specials = max(cfg.pad_id, cfg.bos_id, cfg.eos_id) + 1
    src = torch.randint(specials, cfg.vocab_size, (2, example_src_len), generator=g).to(device)
    src[:, -1] = cfg.eos_id
    with torch.no_grad(), general_path():
        enc = model.encode(src)
        empty = model.init_decoding_state(enc, rows_per_sentence=beam)
        layout = _Layout.of(empty)
        state = empty
        tokens = torch.full((2 * beam, 1), cfg.bos_id, dtype=torch.long, device=device)
        for _ in range(3):  # an example cache of length 3 (sizes 0 and 1 would be specialised)
            state = model.decode_step(tokens, state).state
        values = dict(_leaves(state))
        memory = tuple(values[p] for p in layout.memory)
        cache = tuple(values[p] for p in layout.cache)
    D = torch.export.Dim
    sentences = D("sentences", min=1, max=1024)
    rows = sentences if beam == 1 else beam * sentences
    src_len = D("src_len", min=2, max=cfg.seq_len - 1)
    length = D("length", min=0, max=cfg.seq_len - 2)
    kv = set(layout.kv)
    cache_dims, cache_shapes = [], []
    for p, t in zip(layout.cache, cache):
        dims = {0: rows, 2: length} if p in kv else {0: rows}
        cache_dims.append(dims)
        cache_shapes.append(tuple(
            {0: "rows", 2: "length"}.get(i, str(n)) if p in kv else ("rows" if i == 0 else str(n))
            for i, n in enumerate(t.shape)
        ))  # fmt: skip
    auto = D.AUTO
    memory_dims = [{0: sentences, **{i: auto for i in range(1, t.dim())}} for t in memory]
    with torch.no_grad(), _explained(cfg.family):
        encoder = torch.export.export(
            _Encoder(model, layout), (src,), dynamic_shapes=({0: sentences, 1: src_len},)
        )
        step = torch.export.export(
            _DecoderStep(model, layout),
            (tokens, *memory, *cache),
            dynamic_shapes=({0: rows}, (*memory_dims, *cache_dims)),
        )
    with torch.no_grad(), general_path():
        empty1 = model.init_decoding_state(model.encode(src), rows_per_sentence=1)
    values = dict(_leaves(empty1))
    return TranslationExport(
        encoder=encoder,
        decoder_step=step,
        memory_names=[_name(p) for p in layout.memory],
        cache_names=[_name(p) for p in layout.cache],
        cache_shapes=cache_shapes,
        empty_cache_example=[values[p][:1] for p in layout.cache],
        beam=beam,
        bos_id=cfg.bos_id,
        eos_id=cfg.eos_id,
        pad_id=cfg.pad_id,
        seq_len=cfg.seq_len,
    )


# ---- files ---------------------------------------------------------------------------------

FORMATS = ("pt2", "onnx")


def _write_program(
    program: torch.export.ExportedProgram,
    path: Path,
    fmt: str,
    inputs: list[str],
    outputs: list[str],
) -> Path:
    if fmt == "pt2":
        path = path.with_suffix(".pt2")
        torch.export.save(program, str(path))
        return path
    try:
        import onnxscript  # noqa: F401
    except ImportError as e:
        raise ExportError(
            "ONNX export needs the onnx and onnxscript packages (pip install 'effiformer[export]')"
        ) from e
    path = path.with_suffix(".onnx")
    onnx_program = torch.onnx.export(
        program, dynamo=True, verbose=False, input_names=inputs, output_names=outputs
    )
    onnx_program.save(str(path))
    return path


def _max_diff(a: Tensor, b: Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


@torch.no_grad()
def check_translation(model: nn.Module, exp: TranslationExport, *, steps: int = 6) -> float:
    """The largest difference between the programs' log-probabilities and eager decoding's,
    over ``steps`` steps of three sentences (one padded) fed the eager argmax."""
    from .ops.tracing import general_path

    cfg = model.config
    g = torch.Generator().manual_seed(1)
    specials = max(cfg.pad_id, cfg.bos_id, cfg.eos_id) + 1
    src = torch.randint(specials, cfg.vocab_size, (3, 9), generator=g)
    src[:, -1] = cfg.eos_id
    src[1, 5], src[1, 6:] = cfg.eos_id, cfg.pad_id
    src = src.to(next(model.parameters()).device)
    rows = 3 * exp.beam
    with general_path():
        state = model.init_decoding_state(model.encode(src), rows_per_sentence=exp.beam)
    memory = exp.encoder.module()(src)
    cache = [t.to(src.device) for t in exp.empty_cache(rows)]
    step = exp.decoder_step.module()
    tokens = torch.full((rows, 1), cfg.bos_id, dtype=torch.long, device=src.device)
    worst = 0.0
    for _ in range(steps):
        out = model.decode_step(tokens, state)
        state = out.state
        ref = torch.log_softmax(out.logits[:, -1].float(), dim=-1)
        logp, *cache = step(tokens, *memory, *cache)
        worst = max(worst, _max_diff(logp, ref))
        tokens = ref.argmax(-1, keepdim=True)
    return worst


def export_run(
    run: str | os.PathLike, out: str | os.PathLike, *, fmt: str = "pt2", beam: int = 1
) -> dict[str, Any]:
    """Export the model of a run, run checkpoint or saved model folder into ``out``: the
    programs and ``export.json`` (returned), after checking the programs against eager
    (``export.json``'s ``max_abs_diff``; for ONNX, onnxruntime's outputs where it is
    installed). ``beam``: rows per sentence of an encoder-decoder's step program. Refuses an
    ``out`` that holds an export already."""
    from .checkpoint import CONFIG, load_model, resolve_checkpoint

    if fmt not in FORMATS:
        raise ExportError(f"format must be one of {list(FORMATS)}, got {fmt!r}")
    out = Path(out)
    if (out / "export.json").exists():
        raise ExportError(f"{str(out)!r} holds an export already; choose another folder")
    run = Path(run)
    source = run if (run / CONFIG).is_file() else resolve_checkpoint(run)
    model = load_model(source).eval()
    out.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"source": str(source), "format": fmt, "torch": torch.__version__,
                            "family": model.config.family}  # fmt: skip
    if hasattr(model, "decode_step"):
        exp = export_translation(model, beam=beam)
        diff = check_translation(model, exp)
        enc = _write_program(exp.encoder, out / "encoder", fmt, ["src_ids"], exp.memory_names)
        dec = _write_program(
            exp.decoder_step, out / "decoder_step", fmt,
            ["tokens", *exp.memory_names, *exp.cache_names],
            ["log_probs", *(f"next.{n}" for n in exp.cache_names)],
        )  # fmt: skip
        info.update({
            "kind": "translation", "encoder": enc.name, "decoder_step": dec.name, "beam": beam,
            "encoder_inputs": ["src_ids (sentences, src_len)"], "encoder_outputs": exp.memory_names,
            "decoder_step_inputs": ["tokens (rows, 1)", *exp.memory_names, *exp.cache_names],
            "decoder_step_outputs": ["log_probs (rows, vocab)", *exp.cache_names],
            "cache_shapes": [list(s) for s in exp.cache_shapes], "empty_cache": "empty_cache.pt",
            "bos_id": exp.bos_id, "eos_id": exp.eos_id, "pad_id": exp.pad_id,
            "seq_len": exp.seq_len, "max_abs_diff": diff,
        })  # fmt: skip
        torch.save(exp.empty_cache_example, out / "empty_cache.pt")
        if fmt == "onnx":
            info["onnxruntime_max_abs_diff"] = _check_onnx_translation(model, exp, out / dec.name,
                                                                       out / enc.name)  # fmt: skip
    else:
        prog = export_language_model(model)
        fixed = program_length(prog)
        ids = torch.randint(
            0, model.config.vocab_size, (3, fixed or 11), generator=torch.Generator().manual_seed(1)
        )
        with torch.no_grad():
            diff = _max_diff(prog.module()(ids), model(ids).logits)
        path = _write_program(prog, out / "model", fmt, ["ids"], ["logits"])
        length = "length" if fixed is None else str(fixed)
        info.update({"kind": "language_model", "model": path.name,
                     "inputs": [f"ids (batch, {length})"],
                     "outputs": [f"logits (batch, {length}, vocab)"],
                     "seq_len": model.config.seq_len, "fixed_length": fixed,
                     "max_abs_diff": diff})  # fmt: skip
    for name in ("tokenizer.json", "pair.json", "vocab.json"):
        if (source / name).is_file():
            (out / name).write_bytes((source / name).read_bytes())
    (out / "export.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def _check_onnx_translation(model, exp: TranslationExport, dec_path: Path, enc_path: Path):
    """onnxruntime's log-probabilities against the programs' over a few greedy steps (None
    without onnxruntime)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    cfg = model.config
    g = torch.Generator().manual_seed(2)
    src = torch.randint(max(cfg.pad_id, cfg.bos_id, cfg.eos_id) + 1, cfg.vocab_size, (2, 8),
                        generator=g)  # fmt: skip
    src[:, -1] = cfg.eos_id
    se, sd = ort.InferenceSession(str(enc_path)), ort.InferenceSession(str(dec_path))
    memory = se.run(None, {se.get_inputs()[0].name: src.numpy()})
    rows = 2 * exp.beam
    cache = [t.numpy() for t in exp.empty_cache(rows)]
    names = [i.name for i in sd.get_inputs()]
    step = exp.decoder_step.module()
    with torch.no_grad():
        mem_t = exp.encoder.module()(src)
        cache_t = exp.empty_cache(rows)
        tokens = torch.full((rows, 1), cfg.bos_id, dtype=torch.long)
        worst = 0.0
        for _ in range(4):
            logp, *cache = sd.run(None, dict(zip(names, [tokens.numpy(), *memory, *cache])))
            ref, *cache_t = step(tokens, *mem_t, *cache_t)
            worst = max(worst, _max_diff(torch.from_numpy(logp), ref))
            tokens = ref.argmax(-1, keepdim=True)
    return worst
