"""What every model returns and the checks every model applies at its public boundary."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import ModelConfig
from ..ops.tracing import can_read_values
from ..sampling import check_sampling, sample_next

__all__ = ["ModelOutput", "EffiModel", "lm_loss", "scored_lm_loss", "IGNORE_INDEX"]

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


def register_output(cls: type) -> type:
    """Register a :class:`ModelOutput` dataclass as a pytree node, so ``torch.export`` and
    ``torch.compile`` return it from a traced forward (its subclasses register too)."""
    torch.export.register_dataclass(cls, serialized_type_name=f"{cls.__module__}.{cls.__name__}")
    return cls


register_output(ModelOutput)


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy in nats over targets != IGNORE_INDEX. logits (B, T, V), targets (B, T)."""
    return F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )


def scored_lm_loss(hidden: Tensor, head: Any, targets: Tensor) -> tuple[Tensor, Tensor]:
    """The head only where a target is scored: ``(logits (N, V), loss)`` for the N positions of
    ``targets`` (B, T) that are not IGNORE_INDEX, in row-major order, from ``hidden`` (B, T, D)
    and ``head`` (D -> V). The loss equals :func:`lm_loss` over the full logits; the cost is
    N x V instead of B x T x V (tasks that score a few positions of long sequences, such as
    MQAR's queries, with a large vocabulary)."""
    keep = targets != IGNORE_INDEX
    logits = head(hidden[keep])  # (N, V)
    return logits, F.cross_entropy(logits.float(), targets[keep])


class EffiModel(nn.Module):
    """Base class: input validation, explicit state, buffer updates, a hook for ``bench --part``.

    ``scores_subset``: whether ``forward`` takes ``scored_only=True`` (with targets), computing the
    output head only at the scored positions and returning ``logits`` as ``(N, V)`` for the
    targets that are not IGNORE_INDEX, in row-major order (:func:`scored_lm_loss`); the loss is
    the same. Tasks that score few positions ask for it where a model offers it.
    """

    config: ModelConfig
    scores_subset: bool = False

    def check_input_ids(self, input_ids: Tensor, *, max_len: int | None = None) -> None:
        if not isinstance(input_ids, Tensor):
            raise TypeError(f"input_ids must be a torch.Tensor, got {type(input_ids).__name__}")
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}"
            )
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be an integer tensor (int64), got {input_ids.dtype}")
        if input_ids.shape[1] == 0 or input_ids.shape[0] == 0:
            raise ValueError(
                f"input_ids is empty (shape {tuple(input_ids.shape)}); give at least one row "
                "and one token"
            )
        limit = self.config.seq_len if max_len is None else max_len
        if input_ids.shape[1] > limit:
            raise ValueError(
                f"sequence length {input_ids.shape[1]} exceeds the model's limit seq_len={limit}; "
                "shorten the input or build the model with a larger seq_len"
            )
        if input_ids.numel() and can_read_values(input_ids):
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
        if not can_read_values(targets):
            return
        valid = targets[targets != IGNORE_INDEX]
        if valid.numel() and (int(valid.min()) < 0 or int(valid.max()) >= self.config.vocab_size):
            raise ValueError(
                f"target ids must be in [0, {self.config.vocab_size}) or {IGNORE_INDEX}"
            )

    def init_state(self, batch_size: int, device: torch.device | str | None = None) -> Any:
        """Initial explicit state for a stream of ``batch_size`` rows; ``None`` if stateless."""
        return None

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

    # ---- generation ----------------------------------------------------------------------------

    def init_decoding_state(self, batch_size: int, device: torch.device | str | None = None) -> Any:
        """The state incremental decoding starts from (a memory, or per-layer KV caches), or
        ``None`` when this model can only recompute its window for every new token. Default:
        the recurrent state (:meth:`init_state`)."""
        return self.init_state(batch_size, device)

    def decoding_room(self, state: Any) -> int | None:
        """How many more tokens ``state`` can take before it must be rebuilt (``None``:
        unbounded, e.g. a fixed-size recurrent memory)."""
        return None

    @torch.no_grad()
    def generate(
        self,
        input_ids: Tensor,
        max_new_tokens: int,
        *,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        state: Any = None,
        return_state: bool = False,
    ) -> Tensor | tuple[Tensor, Any]:
        """Sample ``max_new_tokens`` after the prompt ``input_ids`` (B, T) -> (B, T + new).

        Causal language models only. The model runs in eval mode (dropout off) and is put back
        in its mode afterwards. With incremental decoding (:meth:`init_decoding_state`:
        Transformer-XL/Compressive memories, dense KV caches) the prompt is fed in segments of at
        most ``seq_len`` tokens and then every new token is one step against the state, so the
        cost per token does not grow with the output; a KV cache that reaches ``seq_len`` is
        rebuilt from the last ``seq_len // 2`` tokens (the model sees at most ``seq_len`` tokens,
        as in training). Models without incremental decoding recompute their last ``seq_len``
        tokens for every new one. ``temperature=0`` decodes greedily; ``top_k`` / ``top_p``
        filter the distribution (:func:`effiformer.sampling.sample_next`). ``state``: continue
        a stream (memory models); ``return_state``: also return the final state.
        """
        config = self.config
        if callable(getattr(self, "translate", None)):
            raise TypeError(
                f"generate continues a prompt of a language model; this {config.family!r} model "
                "is an encoder-decoder: translate source sentences with model.translate(sources, "
                "beam=...) (token ids or strings with a tokenizer)"
            )
        if not getattr(config, "causal", False):
            raise ValueError(
                f"generate needs a causal language model; this {config.family!r} model is "
                "bidirectional (causal=False)"
            )
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.shape[1] < 1:
            raise ValueError("input_ids must be a (B, T) integer tensor with T >= 1")
        check_sampling(max_new_tokens, temperature, top_k, top_p)
        self.check_input_ids(input_ids, max_len=max(config.seq_len, input_ids.shape[1]))

        def pick(logits: Tensor) -> Tensor:
            return sample_next(
                logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
            )[:, None]  # (B, 1)

        was_training = self.training
        self.eval()
        try:
            b, device = input_ids.shape[0], input_ids.device
            ids = input_ids
            if state is None:
                state = self.init_decoding_state(b, device)
            if state is None:  # recompute the window for every token
                for _ in range(max_new_tokens):
                    logits = self(ids[:, -config.seq_len :]).logits
                    ids = torch.cat([ids, pick(logits[:, -1])], dim=1)
                return (ids, None) if return_state else ids

            def prefill(tokens: Tensor, st: Any) -> tuple[Tensor, Any]:
                out = None
                for start in range(0, tokens.shape[1], config.seq_len):
                    out = self(tokens[:, start : start + config.seq_len], state=st)
                    st = out.state
                return out.logits[:, -1], st

            prompt = ids
            if self.decoding_room(state) is not None:
                prompt = ids[:, -config.seq_len :]
            logits, state = prefill(prompt, state)
            for i in range(max_new_tokens):
                ids = torch.cat([ids, pick(logits)], dim=1)
                if i + 1 == max_new_tokens:
                    break
                room = self.decoding_room(state)
                if room is not None and room < 1:
                    keep = max(1, config.seq_len // 2)
                    logits, state = prefill(ids[:, -keep:], self.init_decoding_state(b, device))
                    continue
                out = self(ids[:, -1:], state=state)
                logits, state = out.logits[:, -1], out.state
            return (ids, state) if return_state else ids
        finally:
            self.train(was_training)

    def sequence_classifier(self, n_labels: int) -> nn.Module:
        """A sequence classifier with ``n_labels`` outputs (1: regression) initialised from this
        pretrained model, with a fresh head. Default: a
        :class:`~effiformer.models.classifier.SequenceClassifier` around this model (weights
        shared, not copied); models with a classifier of their own override it."""
        from .classifier import SequenceClassifier  # the classifier is built on this base class

        return SequenceClassifier(self, n_labels)
