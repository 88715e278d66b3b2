"""What every model returns and the checks every model applies at its public boundary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig

__all__ = ["ModelOutput", "EffiModel", "lm_loss", "IGNORE_INDEX"]

IGNORE_INDEX = -100


@dataclass
class ModelOutput:
    """logits: (B, T, V) or task-shaped; loss: scalar task loss (mean nats per target) or None;
    hidden: (B, T, D) last hidden state; state: explicit recurrent state for the next call;
    aux: auxiliary losses by name (scalars), to be added to ``loss`` for training;
    updates: no-grad buffer updates for :meth:`EffiModel.apply_updates` after the optimiser step.
    """

    logits: Tensor | None = None
    loss: Tensor | None = None
    hidden: Tensor | None = None
    state: Any = None
    aux: dict[str, Tensor] = field(default_factory=dict)
    updates: dict[str, Tensor] = field(default_factory=dict)

    @property
    def total_loss(self) -> Tensor:
        """Task loss plus every auxiliary loss: what a training step differentiates."""
        if self.loss is None:
            raise ValueError("this output has no task loss; pass targets to the model")
        total = self.loss
        for v in self.aux.values():
            total = total + v
        return total


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy in nats over targets != IGNORE_INDEX. logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )


class EffiModel(nn.Module):
    """Base class: input validation, explicit state, buffer updates, a hook for ``bench --part``."""

    config: ModelConfig

    def check_input_ids(self, input_ids: Tensor, *, max_len: int | None = None) -> None:
        if not isinstance(input_ids, Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}"
            )
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be an integer tensor (int64), got {input_ids.dtype}")
        limit = self.config.seq_len if max_len is None else max_len
        if input_ids.shape[1] > limit:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds the model's limit seq_len={limit}; "
                "shorten the input or build the model with a larger seq_len"
            )
        if input_ids.numel():
            lo, hi = int(input_ids.min()), int(input_ids.max())
            if lo < 0 or hi >= self.config.vocab_size:
                bad = lo if lo < 0 else hi
                raise ValueError(
                    f"token id {bad} is outside the vocabulary [0, {self.config.vocab_size})"
                )

    def check_targets(self, targets: Tensor, input_ids: Tensor) -> None:
        if targets.shape != input_ids.shape:
            raise ValueError(
                f"targets must have the shape of input_ids {tuple(input_ids.shape)}, "
                f"got {tuple(targets.shape)}"
            )
        valid = targets[targets != IGNORE_INDEX]
        if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= self.config.vocab_size):
            raise ValueError(
                f"target ids must be in [0, {self.config.vocab_size}) or {IGNORE_INDEX}"
            )

    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> Any:
        """Initial explicit state for a stream of ``batch_size`` rows; ``None`` if stateless."""
        return None

    def attention_part(self, x: Tensor) -> Tensor:
        """Run one attention layer of this model on hidden states x (B, T, D) -> (B, T, D).

        Used by ``effiformer bench --part attention``; models override it when their attention
        needs positional inputs or state.
        """
        raise NotImplementedError(f"{type(self).__name__} does not expose an attention part")

    @torch.no_grad()
    def apply_updates(self, updates: dict[str, Tensor]) -> None:
        """Copy no-grad buffer updates (from ``ModelOutput.updates``) into this model's buffers."""
        if not updates:
            return
        buffers = dict(self.named_buffers())
        for name, value in updates.items():
            if name not in buffers:
                raise KeyError(f"update for unknown buffer {name!r}")
            buffers[name].copy_(value)

    def aux_parameters(self) -> list[nn.Parameter]:
        """Parameters trained only by auxiliary losses (``ModelOutput.aux``) and never by the task
        loss, e.g. the Compressive Transformer's compression networks. The trainer clips their
        gradient norm as a group of its own (:func:`effiformer.train.clip_gradients`), as if
        they had their own optimiser. Default: none."""
        return []

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def sequence_classifier(self, n_labels: int) -> nn.Module:
        """A sequence classifier with ``n_labels`` outputs (1: regression) initialised from this
        pretrained model, with a fresh head. Default: a
        :class:`~effiformer.models.classifier.SequenceClassifier` around this model (weights
        shared, not copied); models with a classifier of their own override it."""
        from .classifier import SequenceClassifier  # the classifier is built on this base class

        return SequenceClassifier(self, n_labels)
