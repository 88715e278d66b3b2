"""Reference rows for ``effiformer bench``: other implementations timed beside ours.

A reference is a factory that receives the :class:`CellSpec` of a cell (the model's config with
the ``--set`` overrides, the part, the length, batch, device and dtype) and returns a
:class:`Workload` (or a bare callable returning a tensor) to time at the same shape. It is
registered once for a family (``"vanilla"``), an exact model name (``"vanilla-small"``) or every
family (``"*"``), and optionally only for models whose attention is one of ``attention`` (the
attention config's ``name``: a row that times an LSH layer stands beside every model with LSH
attention, whatever its family, and beside no other)::

    from effiformer.bench import CellSpec, Workload, register_reference

    def hf_funnel(spec: CellSpec) -> Workload:
        from transformers import FunnelConfig, FunnelModel   # imported inside: optional extra
        ...
        return Workload(forward=lambda: model(ids).last_hidden_state, module=model)

    register_reference("funnel", hf_funnel, name="hf-funnel", parts=("model",),
                       requires=("transformers",))

A reference whose ``requires`` packages are not importable is reported as a skipped row with the
reason, never an error. Each cell runs in a fresh process, which imports the module that defined
the factory (``factory.__module__``) or the ``--plugin`` files again, so register references at
import time of a module (this one, or a plugin file passed with ``--plugin``).

Built-in references (no extra needed):

- ``sdpa`` (every family, ``--part attention``): one bare
  ``torch.nn.functional.scaled_dot_product_attention`` call on random (B, H, T, Dh) q, k, v with the
  config's causality: no projections, no module. It is the baseline the table's ratios use.
- ``torch-mha`` (vanilla, ``--part attention``): ``torch.nn.MultiheadAttention`` with the same
  width and heads (projections included, like our dense layer).
- ``torch-nn`` (vanilla, ``--part model``): embedding, sinusoids, a ``torch.nn.TransformerEncoder``
  stack of ``n_layers`` ``TransformerEncoderLayer`` s (same width, heads, FFN, activation, pre-/post-LN,
  causal mask), final LayerNorm and a tied LM head with cross-entropy: PyTorch's public dense
  Transformer at the shape of our vanilla model.

And one that needs the ``reference`` extra (``transformers``):

- ``hf-funnel`` (funnel, ``--part model``): HF transformers' ``FunnelForMaskedLM`` at the same
  config (translated by :mod:`effiformer.interop.hf_funnel`).
- ``hf-marian`` (seq2seq, ``--part decoding``): HF transformers' ``MarianMTModel`` at the same
  dimensions (:func:`hf_marian`), randomly initialised, ``generate`` with beam ``beam`` and
  exactly ``steps`` new tokens (``min_new_tokens = max_new_tokens``), its KV caches on: the
  whole translation beside our encoder + beam search.

The mechanisms' own reference modules (``sparse_references``, ``routing_references``,
``adaptive_span_references``, ``reformer_references``) are imported by
:mod:`effiformer.bench` itself (:data:`effiformer.bench.BUILTIN_REFERENCE_MODULES`), so their
rows need no ``--plugin``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig

__all__ = [
    "PARTS",
    "TRAINING_PARTS",
    "CellSpec",
    "Workload",
    "Reference",
    "register_reference",
    "list_references",
    "references_for",
    "missing_requirements",
    "hf_marian",
]

PARTS = ("model", "attention", "decoding")
#: The parts timed forward and forward+backward (``--part both``); ``decoding`` is timed as
#: whole translations (encoder-decoder models, :mod:`effiformer.bench.decoding`).
TRAINING_PARTS = ("model", "attention")


@dataclass(frozen=True)
class CellSpec:
    """What one cell measures. ``config`` is the model's config with every override applied
    (``--set`` items, ``seq_len >= seq_len``, dropout 0), ``name`` the registered model name the
    cell belongs to (for a reference: the model it stands beside). For ``part="decoding"``:
    ``seq_len`` is the source length, ``batch`` 1, ``beam`` the beam size and ``steps`` the
    number of decoder steps every translation runs."""

    name: str
    config: ModelConfig
    part: str
    seq_len: int
    batch: int
    device: torch.device
    dtype: torch.dtype
    beam: int = 1
    steps: int | None = None

    @property
    def family(self) -> str:
        return self.config.family


@dataclass
class Workload:
    """One timed step.

    forward: runs one forward pass and returns a tensor; the fwd+bwd step backpropagates
        ``loss(output)``. Everything it needs (model, inputs) is built before, outside timing.
    loss: output -> scalar; default: the output itself when it is a scalar, else ``output.sum()``.
    module: the module whose parameters are counted (``params`` = parameters that receive a
        gradient in the step) and whose gradients are reset (to ``None``) before each step.
    inputs: leaf tensors requiring grad (inputs), their gradients reset before each step too.
    info: JSON-able facts about the workload copied into the cell's record (the model row of a
        memory model records ``model_state`` and ``memory_lens`` here).

    For ``part="decoding"`` ``forward`` runs one whole translation (its output is ignored) and
    is timed under ``torch.inference_mode``, never differentiated.
    """

    forward: Callable[[], Tensor]
    loss: Callable[[Tensor], Tensor] | None = None
    module: nn.Module | None = None
    inputs: Sequence[Tensor] = field(default_factory=tuple)
    info: dict = field(default_factory=dict)

    def step_loss(self, out: Tensor) -> Tensor:
        if self.loss is not None:
            return self.loss(out)
        return out if out.dim() == 0 else out.sum()

    def zero_grad(self) -> None:
        if self.module is not None:
            self.module.zero_grad(set_to_none=True)
        for t in self.inputs:
            t.grad = None

    def params_with_grad(self) -> int:
        if self.module is None:
            return 0
        return sum(p.numel() for p in self.module.parameters() if p.grad is not None)


Factory = Callable[[CellSpec], "Workload | Callable[[], Tensor]"]


@dataclass(frozen=True)
class Reference:
    """A registered reference row (see the module docstring)."""

    name: str
    target: str
    factory: Factory
    parts: tuple[str, ...] = ("attention",)
    requires: tuple[str, ...] = ()
    baseline: bool = False
    description: str = ""
    estimate_bytes: Callable[[CellSpec], int] | None = None
    attention: tuple[str, ...] = ()

    def matches(self, name: str, family: str, attention: str | None = None) -> bool:
        """Whether this row stands beside model ``name`` of ``family`` whose attention config is
        named ``attention`` (None: unknown, which an attention-bound row does not match)."""
        if self.target not in ("*", name, family):
            return False
        return not self.attention or attention in self.attention

    @property
    def module(self) -> str:
        return self.factory.__module__

    def build(self, spec: CellSpec) -> Workload:
        made = self.factory(spec)
        if isinstance(made, Workload):
            return made
        if callable(made):
            return Workload(forward=made)
        raise TypeError(
            f"reference {self.name!r}: the factory must return a Workload or a callable, "
            f"got {type(made).__name__}"
        )


_REFERENCES: dict[tuple[str, str], Reference] = {}


def register_reference(
    family_or_name: str,
    factory: Factory,
    *,
    name: str,
    parts: Iterable[str] = ("attention",),
    requires: Iterable[str] = (),
    baseline: bool = False,
    description: str = "",
    estimate_bytes: Callable[[CellSpec], int] | None = None,
    attention: Iterable[str] = (),
) -> Reference:
    """Register ``factory`` as the reference row ``name`` beside ``family_or_name``.

    Args:
        family_or_name: a family (``"vanilla"``), an exact registered name, or ``"*"`` (all).
        factory: ``CellSpec -> Workload`` (or a callable returning a tensor).
        name: the row's name in tables, plots and ``results.jsonl`` (lowercase, hyphenated).
        parts: which ``--part`` values it stands beside (``"model"``, ``"attention"``).
        requires: importable packages it needs; without them the row is skipped with the reason.
        baseline: ratios in the table are taken against this row when it is present.
        estimate_bytes: its own memory estimate for a cell (default: the model's estimate).
        attention: the attention config names (``"lsh"``, ``"routing"``) it stands beside; empty:
            any attention of the target.

    Re-registering the same factory (same module and qualified name) under the same name and
    target replaces it, so a plugin file may be imported twice; anything else already registered
    under that name and target is an error.
    """
    if not name or name != name.lower() or " " in name or "_" in name:
        raise ValueError(f"reference names are lowercase and hyphenated, got {name!r}")
    parts = tuple(parts)
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        raise ValueError(f"parts must be a non-empty subset of {list(PARTS)}, got {list(parts)}")
    if not callable(factory):
        raise TypeError(f"factory must be callable, got {type(factory).__name__}")
    key = (family_or_name, name)
    old = _REFERENCES.get(key)
    if old is not None and _qualname(old.factory) != _qualname(factory):
        raise ValueError(f"reference {name!r} for {family_or_name!r} is already registered")
    ref = Reference(
        name=name,
        target=family_or_name,
        factory=factory,
        parts=parts,
        requires=tuple(requires),
        baseline=baseline,
        description=description,
        estimate_bytes=estimate_bytes,
        attention=tuple(attention),
    )
    _REFERENCES[key] = ref
    return ref


def _qualname(f: Callable) -> str:
    return f"{getattr(f, '__module__', '?')}.{getattr(f, '__qualname__', repr(f))}"


def list_references() -> list[Reference]:
    """Every registered reference, in registration order."""
    return list(_REFERENCES.values())


def references_for(
    name: str, family: str, part: str, attention: str | None = None
) -> list[Reference]:
    """References that stand beside model ``name`` of ``family`` (attention config named
    ``attention``) for ``part``."""
    return [
        r for r in _REFERENCES.values() if part in r.parts and r.matches(name, family, attention)
    ]


def missing_requirements(ref: Reference) -> list[str]:
    """The packages ``ref`` requires that cannot be imported here."""
    missing = []
    for pkg in ref.requires:
        try:
            found = importlib.util.find_spec(pkg) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(pkg)
    return missing


# --------------------------------------------------------------------------- built-in references


def _sdpa_reference(spec: CellSpec) -> Workload:
    c = spec.config
    shape = (spec.batch, c.n_heads, spec.seq_len, c.head_dim)  # (B, H, T, Dh)
    q, k, v = (
        torch.randn(shape, device=spec.device, dtype=spec.dtype).requires_grad_() for _ in range(3)
    )
    causal = bool(c.causal)

    def forward() -> Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return Workload(forward=forward, inputs=(q, k, v))


def _sdpa_estimate(spec: CellSpec) -> int:
    c = spec.config
    elt = torch.empty((), dtype=spec.dtype).element_size()
    b, h, t, dh = spec.batch, c.n_heads, spec.seq_len, c.head_dim
    # q, k, v, out and their grads, plus (conservatively) materialised scores and their grad.
    return elt * (8 * b * h * t * dh + 2 * b * h * t * t)


def _torch_mha_reference(spec: CellSpec) -> Workload:
    c = spec.config
    if c.n_heads * c.head_dim != c.dim:
        raise ValueError(
            f"torch-mha needs n_heads * head_dim == dim, got {c.n_heads} * {c.head_dim} != {c.dim}"
        )
    mha = nn.MultiheadAttention(c.dim, c.n_heads, dropout=0.0, bias=True, batch_first=True)
    mha.to(device=spec.device, dtype=spec.dtype).train()
    x = torch.randn(spec.batch, spec.seq_len, c.dim, device=spec.device, dtype=spec.dtype)
    x.requires_grad_()
    causal = bool(c.causal)
    mask = _causal_mask(spec.seq_len, spec.device, spec.dtype) if causal else None

    def forward() -> Tensor:
        return mha(x, x, x, need_weights=False, attn_mask=mask, is_causal=causal)[0]  # (B, T, D)

    return Workload(forward=forward, module=mha, inputs=(x,))


def _causal_mask(t: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    return nn.Transformer.generate_square_subsequent_mask(t, device=device, dtype=dtype)  # (T, T)


class _TorchNNLM(nn.Module):
    """PyTorch's public dense Transformer at the shape of a vanilla config (see module docstring)."""

    def __init__(self, c: ModelConfig) -> None:
        super().__init__()
        activation = getattr(c, "activation", "gelu")
        if activation not in ("gelu", "relu"):
            raise ValueError(f"torch-nn supports activation gelu or relu, got {activation!r}")
        if c.n_heads * c.head_dim != c.dim:
            raise ValueError(
                f"torch-nn needs n_heads * head_dim == dim, got {c.n_heads} * {c.head_dim} != "
                f"{c.dim}"
            )
        norm_first = bool(getattr(c, "norm_first", True))
        self.causal = bool(c.causal)
        self.embed = nn.Embedding(c.vocab_size, c.dim)
        layer = nn.TransformerEncoderLayer(
            c.dim,
            c.n_heads,
            dim_feedforward=c.ffn_dim,
            dropout=0.0,
            activation=activation,
            batch_first=True,
            norm_first=norm_first,
        )
        self.encoder = nn.TransformerEncoder(layer, c.n_layers, enable_nested_tensor=False)
        self.final_norm = nn.LayerNorm(c.dim) if norm_first else nn.Identity()
        self.head = nn.Linear(c.dim, c.vocab_size, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: Tensor, pos: Tensor, mask: Tensor | None) -> Tensor:
        x = self.embed(ids) + pos  # (B, T, D)
        x = self.encoder(x, mask=mask, is_causal=self.causal)
        logits = self.head(self.final_norm(x))  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids.reshape(-1))


def _hf_funnel_reference(spec: CellSpec) -> Workload:
    """HF transformers' ``FunnelForMaskedLM`` (FunnelModel: encoder + decoder, plus its tied LM
    head) at the cell's config, forward + MLM loss with ``labels = input_ids``: the same work as
    effiformer's model row, whose MLM head additionally has the official dense/LN transform
    (d x d). The config translation is :func:`effiformer.interop.hf_funnel.config_to_hf`."""
    import transformers

    from ..interop.hf_funnel import config_to_hf

    c = spec.config
    fields = config_to_hf(c, "FunnelForMaskedLM")
    for k in ("architectures", "model_type"):
        fields.pop(k)
    model = transformers.FunnelForMaskedLM(transformers.FunnelConfig(**fields))
    model.to(device=spec.device, dtype=spec.dtype).train()
    ids = torch.randint(0, c.vocab_size, (spec.batch, spec.seq_len), device=spec.device)
    return Workload(forward=lambda: model(ids, labels=ids).loss, module=model)


def _torch_nn_reference(spec: CellSpec) -> Workload:
    from ..layers.positions import sinusoid_table

    c = spec.config
    model = _TorchNNLM(c).to(device=spec.device, dtype=spec.dtype).train()
    t = spec.seq_len
    ids = torch.randint(0, c.vocab_size, (spec.batch, t), device=spec.device)
    pos = sinusoid_table(torch.arange(t, device=spec.device), c.dim).to(spec.dtype)  # (T, D)
    mask = _causal_mask(t, spec.device, spec.dtype) if spec.config.causal else None
    return Workload(forward=lambda: model(ids, pos, mask), module=model)


def hf_marian(cfg: ModelConfig):
    """A randomly initialised HF ``MarianMTModel`` (eval mode) at the dimensions of a seq2seq
    config: layers, width, heads, FFN, ReLU, scaled tied embeddings, sinusoidal positions,
    the config's pad/EOS/BOS ids, dropout 0. Needs ``transformers``."""
    from transformers import MarianConfig, MarianMTModel

    hf = MarianConfig(
        vocab_size=cfg.vocab_size,
        d_model=cfg.dim,
        encoder_layers=cfg.n_layers,
        decoder_layers=cfg.decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.ffn_dim,
        decoder_ffn_dim=cfg.ffn_dim,
        activation_function="relu",
        max_position_embeddings=cfg.seq_len,
        scale_embedding=True,
        pad_token_id=cfg.pad_id,
        eos_token_id=cfg.eos_id,
        decoder_start_token_id=cfg.bos_id,
        forced_eos_token_id=None,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )
    return MarianMTModel(hf).eval()


def _hf_marian_reference(spec: CellSpec) -> Workload:
    c = spec.config
    model = hf_marian(c).to(device=spec.device, dtype=spec.dtype)
    steps = spec.seq_len if spec.steps is None else spec.steps
    g = torch.Generator().manual_seed(0)
    specials = max(c.pad_id, c.bos_id, c.eos_id) + 1
    src = torch.randint(specials, c.vocab_size, (1, spec.seq_len), generator=g)  # (1, S)
    src[0, -1] = c.eos_id
    src = src.to(spec.device)
    attention_mask = torch.ones_like(src)

    def forward() -> Tensor:
        return model.generate(
            input_ids=src, attention_mask=attention_mask, num_beams=spec.beam,
            min_new_tokens=steps, max_new_tokens=steps, do_sample=False, early_stopping=True,
            use_cache=True,
        )  # fmt: skip

    return Workload(forward=forward, module=model)


register_reference(
    "*",
    _sdpa_reference,
    name="sdpa",
    parts=("attention",),
    baseline=True,
    description="bare F.scaled_dot_product_attention on (B, H, T, Dh); no projections",
    estimate_bytes=_sdpa_estimate,
)
register_reference(
    "vanilla",
    _torch_mha_reference,
    name="torch-mha",
    parts=("attention",),
    description="torch.nn.MultiheadAttention, same width and heads (with projections)",
)
register_reference(
    "vanilla",
    _torch_nn_reference,
    name="torch-nn",
    parts=("model",),
    description="embedding + torch.nn.TransformerEncoder stack + tied head, same shape",
)
register_reference(
    "funnel",
    _hf_funnel_reference,
    name="hf-funnel",
    parts=("model",),
    requires=("transformers",),
    description="HF transformers FunnelForMaskedLM at the same config",
)
register_reference(
    "seq2seq",
    _hf_marian_reference,
    name="hf-marian",
    parts=("decoding",),
    requires=("transformers",),
    description="HF transformers MarianMTModel.generate at the same dims, same beam and steps",
)
