"""Sequence classifiers built from pretrained models, and the record that rebuilds them.

:meth:`EffiModel.sequence_classifier(n_labels) <effiformer.models.base.EffiModel.sequence_classifier>`
turns a pretrained model into a classifier: by default :class:`SequenceClassifier` around it;
models with a classifier of their own override it (the Funnel MLM and ELECTRA models return an
encoder-only :class:`~effiformer.models.funnel.FunnelForSequenceClassification` with the
pretrained encoder weights).

A classifier class is registered under a *kind* (:func:`register_classifier`); checkpoints
record :func:`classifier_kind` of the model they hold, and :func:`build_classifier` rebuilds an
untrained classifier of that kind from the saved config, ready for the saved weights. ``encoder``
is :class:`SequenceClassifier` (registered here), ``funnel`` the Funnel classifier (registered in
:mod:`effiformer.models.funnel`).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from ..config import ModelConfig
from ..layers import prefix_keys
from ..layers.heads import SequenceClassificationHead, sequence_classification_loss
from ..registry import build_model
from .base import EffiModel, ModelOutput

__all__ = [
    "SequenceClassifier",
    "build_classifier",
    "classifier_kind",
    "register_classifier",
]

_BUILDERS: dict[str, Callable[[ModelConfig, int], nn.Module]] = {}
_KINDS: dict[type, str] = {}


def register_classifier(
    kind: str, cls: type, build: Callable[[ModelConfig, int], nn.Module] | None = None
) -> None:
    """Register classifier class ``cls`` under ``kind``; ``build(config, n_labels)`` makes an
    untrained one from the config saved with it (default: ``cls(config, n_labels)``)."""
    if kind in _BUILDERS and _KINDS.get(cls) != kind:
        raise ValueError(f"classifier kind {kind!r} is already registered")
    _BUILDERS[kind] = build if build is not None else cls
    _KINDS[cls] = kind


def classifier_kind(model: nn.Module) -> str | None:
    """The registered kind of ``model``'s class (or of its nearest registered base class);
    ``None`` when it is not a registered classifier."""
    for cls in type(model).__mro__:
        if cls in _KINDS:
            return _KINDS[cls]
    return None


def build_classifier(kind: str, config: ModelConfig, n_labels: int) -> nn.Module:
    """An untrained classifier of ``kind`` for ``config`` with ``n_labels`` outputs."""
    if kind not in _BUILDERS:
        raise KeyError(
            f"unknown classifier kind {kind!r}; registered kinds: {', '.join(sorted(_BUILDERS))}"
        )
    return _BUILDERS[kind](config, n_labels)


class SequenceClassifier(EffiModel):
    """A sequence-classification head on any encoder whose forward returns ``ModelOutput.hidden``
    (B, T, D), e.g. the dense :class:`~effiformer.models.Transformer` with ``causal=False``:
    hidden[:, 0] ([CLS]) -> :class:`~effiformer.layers.heads.SequenceClassificationHead`.
    Encoders with an ``encode`` method (the dense Transformer) skip their own output head (the
    tied MLM head); others run it and it is ignored.

    forward(input_ids (B, T), *, labels (B,) | None, attention_mask (B, T) | None,
    token_type_ids: ignored, the dense encoder has no segment embedding)
    -> ModelOutput(logits (B, n_labels), loss, hidden (B, T, D)).
    """

    def __init__(self, encoder: nn.Module, n_labels: int) -> None:
        super().__init__()
        config = getattr(encoder, "config", None)
        if config is None:
            raise TypeError(f"encoder must carry a .config, got {type(encoder).__name__}")
        if getattr(config, "causal", False):
            raise ValueError("a sequence classifier needs a bidirectional encoder (causal=False)")
        self.config, self.n_labels = config, n_labels
        self.encoder = encoder
        self.head = SequenceClassificationHead(config.dim, n_labels, dropout=config.dropout)
        for p in self.head.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            else:
                nn.init.zeros_(p)

    def forward(
        self,
        input_ids: Tensor,
        *,
        labels: Tensor | None = None,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
    ) -> ModelOutput:
        encode = getattr(self.encoder, "encode", None)
        if encode is not None:
            enc = encode(input_ids, attention_mask=attention_mask)  # hidden (B, T, D), no head
        else:
            enc = self.encoder(input_ids, attention_mask=attention_mask)  # hidden (B, T, D)
        h = enc.hidden
        logits = self.head(h)  # (B, n_labels)
        loss = None if labels is None else sequence_classification_loss(logits, labels)
        return ModelOutput(
            logits=logits,
            loss=loss,
            hidden=h,
            aux=prefix_keys(enc.aux, "encoder."),
            updates=prefix_keys(enc.updates, "encoder."),
        )


register_classifier(
    "encoder",
    SequenceClassifier,
    lambda config, n_labels: SequenceClassifier(build_model(config), n_labels),
)
