"""Load HuggingFace Funnel-Transformer checkpoints into effiformer, and save them back.

Reads a local directory holding ``config.json`` plus ``model.safetensors`` (or the legacy
``pytorch_model.bin``) written by ``transformers``' ``save_pretrained``; ``transformers`` itself is
not needed. Every key and every shape is checked in both directions (nanoGPT's port style): a
missing, unexpected or mis-shaped tensor is an error naming it.

Architectures (``config.json: architectures[0]``) and what they become:

    FunnelModel                      -> FunnelModel (encoder + decoder)
    FunnelBaseModel                  -> FunnelModel(decoder=False)
    FunnelForMaskedLM                -> FunnelForMaskedLM
    FunnelForSequenceClassification  -> FunnelForSequenceClassification (encoder only)
    FunnelForMultipleChoice          -> FunnelForMultipleChoice (encoder only)
    FunnelForTokenClassification     -> FunnelForTokenClassification
    FunnelForQuestionAnswering       -> FunnelForQuestionAnswering

HF-vs-official differences bridged here:

- HF's ``FunnelForMaskedLM`` head is a single linear layer tied to the word embedding; the
  official TF head (and effiformer's default) first applies dense -> gelu -> LayerNorm. The loader
  sets ``mlm_transform=False``.
- HF pools the padding mask with the opposite polarity (a pooled slot is padding if *either* of
  its tokens is); effiformer follows the official code (padding only if *both* are). Outputs agree
  on inputs without padding, and on padded inputs whenever no pooling window straddles the
  padding boundary. This is not bridged: it is the documented difference.
- HF's decoder adds ``hidden_states[block_sizes[0]]``, which is not the output of block 1 when
  ``block_repeats[0] > 1``; effiformer adds the output of block 1 (paper and official code). A
  warning is logged for such checkpoints; HF's named checkpoints all have ``block_repeats[0] = 1``.
- HF defaults ``token_type_ids`` to zeros, so the token-type term is always present; effiformer's
  ``token_type_ids=None`` gives the same scores.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..attention.funnel_relative import FunnelAttentionConfig
from ..checkpoint import CheckpointError, atomic_write_bytes
from ..models.funnel import (
    FunnelConfig,
    FunnelForMaskedLM,
    FunnelForMultipleChoice,
    FunnelForQuestionAnswering,
    FunnelForSequenceClassification,
    FunnelForTokenClassification,
    FunnelModel,
)

__all__ = ["load_hf_funnel", "save_hf_funnel", "config_from_hf", "config_to_hf", "hf_key"]

logger = logging.getLogger(__name__)

_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}
_ACTIVATIONS_BACK = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}

# effiformer class, whether it has a decoder, and whether labels are needed
_ARCHS: dict[str, tuple[type[nn.Module], bool]] = {
    "FunnelModel": (FunnelModel, True),
    "FunnelBaseModel": (FunnelModel, False),
    "FunnelForMaskedLM": (FunnelForMaskedLM, True),
    "FunnelForSequenceClassification": (FunnelForSequenceClassification, False),
    "FunnelForMultipleChoice": (FunnelForMultipleChoice, False),
    "FunnelForTokenClassification": (FunnelForTokenClassification, True),
    "FunnelForQuestionAnswering": (FunnelForQuestionAnswering, True),
}

# Layer-internal renames, effiformer -> HF (applied to ".<name>." segments).
_LAYER = [
    (".attn.q_proj.", ".attention.q_head."),
    (".attn.k_proj.", ".attention.k_head."),
    (".attn.v_proj.", ".attention.v_head."),
    (".attn.o_proj.", ".attention.post_proj."),
    (".attn.", ".attention."),
    (".norm1.", ".attention.layer_norm."),
    (".norm2.", ".ffn.layer_norm."),
    (".ffn.fc1.", ".ffn.linear_1."),
    (".ffn.fc2.", ".ffn.linear_2."),
]


def hf_key(key: str, arch: str) -> str:
    """The HF state-dict key of the effiformer key ``key`` for architecture ``arch``."""
    prefix = "funnel." if key.startswith("funnel.") else ""
    body = key[len(prefix) :]
    if body.startswith("encoder.embed."):
        body = "embeddings.word_embeddings." + body[len("encoder.embed.") :]
    elif body.startswith("encoder.embed_norm."):
        body = "embeddings.layer_norm." + body[len("encoder.embed_norm.") :]
    elif body.startswith("head."):
        rest = body[len("head.") :]
        if arch == "FunnelForMaskedLM":
            body = "lm_head." + rest.removeprefix("decoder.")
        elif arch in ("FunnelForSequenceClassification", "FunnelForMultipleChoice"):
            body = "classifier." + rest.replace("dense.", "linear_hidden.").replace(
                "out.", "linear_out."
            )
        elif arch == "FunnelForTokenClassification":
            body = "classifier." + rest.removeprefix("out.")
        elif arch == "FunnelForQuestionAnswering":
            body = "qa_outputs." + rest.removeprefix("out.")
        else:
            raise CheckpointError(f"unexpected head key {key!r} for {arch}")
    else:
        for mine, theirs in _LAYER:
            if mine in body:
                body = body.replace(mine, theirs, 1)
                break
    return prefix + body


def config_from_hf(hf: dict[str, Any], *, seq_len: int = 512) -> FunnelConfig:
    """Map an HF ``FunnelConfig`` dict to :class:`FunnelConfig` (MLM head without transform)."""
    if hf.get("model_type") != "funnel":
        raise CheckpointError(
            f"config.json has model_type {hf.get('model_type')!r}, expected 'funnel'"
        )
    act = hf.get("hidden_act", "gelu_new")
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"hidden_act {act!r} is not supported; known: {sorted(_ACTIVATIONS)}")
    sizes = tuple(hf.get("block_sizes", (4, 4, 4)))
    reps = hf.get("block_repeats") or [1] * len(sizes)
    return FunnelConfig(
        vocab_size=hf.get("vocab_size", 30522),
        dim=hf.get("d_model", 768),
        n_heads=hf.get("n_head", 12),
        head_dim=hf.get("d_head", 64),
        ffn_dim=hf.get("d_inner", 3072),
        seq_len=seq_len,
        block_sizes=sizes,
        block_repeats=tuple(reps),
        n_decoder_layers=hf.get("num_decoder_layers", 2),
        activation=_ACTIVATIONS[act],
        dropout=float(hf.get("hidden_dropout", 0.1)),
        attn_dropout=float(hf.get("attention_dropout", 0.1)),
        activation_dropout=float(hf.get("activation_dropout", 0.0)),
        norm_eps=float(hf.get("layer_norm_eps", 1e-9)),
        pooling=hf.get("pooling_type", "mean"),
        attention=FunnelAttentionConfig(
            kind=hf.get("attention_type", "relative_shift"),
            init_range=float(hf.get("initializer_range", 0.1)),
        ),
        separate_cls=bool(hf.get("separate_cls", True)),
        truncate_seq=bool(hf.get("truncate_seq", True)),
        pool_q_only=bool(hf.get("pool_q_only", True)),
        init_std=hf.get("initializer_std"),
        mlm_transform=False,
    )


def config_to_hf(config: FunnelConfig, arch: str, n_labels: int | None = None) -> dict[str, Any]:
    """An HF ``config.json`` dict for ``config`` and architecture ``arch``."""
    if config.activation not in _ACTIVATIONS_BACK:
        raise CheckpointError(f"activation {config.activation!r} has no HF name")
    out: dict[str, Any] = {
        "model_type": "funnel",
        "architectures": [arch],
        "vocab_size": config.vocab_size,
        "d_model": config.dim,
        "n_head": config.n_heads,
        "d_head": config.head_dim,
        "d_inner": config.ffn_dim,
        "block_sizes": list(config.block_sizes),
        "block_repeats": list(config.block_repeats or ()),
        "num_decoder_layers": config.n_decoder_layers,
        "hidden_act": _ACTIVATIONS_BACK[config.activation],
        "hidden_dropout": config.dropout,
        "attention_dropout": config.attn_dropout,
        "activation_dropout": config.activation_dropout,
        "layer_norm_eps": config.norm_eps,
        "pooling_type": config.pooling,
        "attention_type": config.attention.kind,
        "separate_cls": config.separate_cls,
        "truncate_seq": config.truncate_seq,
        "pool_q_only": config.pool_q_only,
        "initializer_range": config.attention.init_range,
        "initializer_std": config.init_std,
        "tie_word_embeddings": True,
    }
    if n_labels is not None:
        out["id2label"] = {str(i): f"LABEL_{i}" for i in range(n_labels)}
        out["label2id"] = {f"LABEL_{i}": i for i in range(n_labels)}
    return out


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    st = directory / "model.safetensors"
    if st.is_file():
        return load_file(str(st))
    pt = directory / "pytorch_model.bin"
    if pt.is_file():
        return torch.load(pt, map_location="cpu", weights_only=True)
    raise CheckpointError(
        f"{str(directory)!r} has neither model.safetensors nor pytorch_model.bin "
        "(sharded checkpoints are not supported)"
    )


def _n_labels(hf: dict[str, Any]) -> int:
    if "id2label" in hf and hf["id2label"]:
        return len(hf["id2label"])
    return int(hf.get("num_labels", 2))


def load_hf_funnel(
    directory: str | os.PathLike, *, architecture: str | None = None, seq_len: int = 512
) -> nn.Module:
    """Build the effiformer model matching an HF Funnel checkpoint directory and load it.

    ``architecture`` overrides ``config.json``'s ``architectures[0]``. Returns the model in eval
    mode. Raises :class:`CheckpointError` on any missing, unexpected or mis-shaped tensor.
    """
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{str(directory)!r} has no config.json")
    hf = json.loads(cfg_path.read_text())
    arch = architecture or (hf.get("architectures") or ["FunnelModel"])[0]
    if arch not in _ARCHS:
        raise CheckpointError(f"architecture {arch!r} is not supported; known: {sorted(_ARCHS)}")
    config = config_from_hf(hf, seq_len=seq_len)
    cls, with_decoder = _ARCHS[arch]
    if with_decoder and config.block_repeats[0] > 1:
        logger.warning(
            "HF adds hidden_states[block_sizes[0]] in the decoder, which is not block 1's output "
            "when block_repeats[0] > 1; effiformer adds block 1's output, so outputs will differ"
        )
    if cls is FunnelModel:
        model = FunnelModel(config, decoder=with_decoder)
    elif cls in (FunnelForSequenceClassification, FunnelForTokenClassification):
        model = cls(config, n_labels=_n_labels(hf))
    elif cls is FunnelForMaskedLM:
        if not hf.get("tie_word_embeddings", True):
            raise CheckpointError("untied MLM heads are not supported (tie_word_embeddings=false)")
        model = cls(config)
    else:
        model = cls(config)
    theirs = _read_weights(directory)
    ours = model.state_dict()
    tied = {"head.decoder.weight"} if arch == "FunnelForMaskedLM" else set()
    expected: dict[str, str] = {k: hf_key(k, arch) for k in ours}
    missing = [h for k, h in expected.items() if h not in theirs and k not in tied]
    unexpected = sorted(set(theirs) - set(expected.values()))
    if missing or unexpected:
        raise CheckpointError(
            f"{str(directory)!r} does not match {arch}: missing {sorted(missing)[:8]}, "
            f"unexpected {unexpected[:8]}"
        )
    new_state = {}
    for k, h in expected.items():
        if k in tied and h not in theirs:
            continue  # the tied copy of the word embedding
        t = theirs[h]
        if t.shape != ours[k].shape:
            raise CheckpointError(
                f"{h}: shape {tuple(t.shape)} in the checkpoint, {tuple(ours[k].shape)} expected"
            )
        new_state[k] = t
    if "head.decoder.weight" in tied and "lm_head.weight" in theirs:
        emb = theirs["funnel.embeddings.word_embeddings.weight"]
        if not torch.equal(theirs["lm_head.weight"], emb):
            raise CheckpointError("lm_head.weight differs from the word embedding (untied head)")
    with torch.no_grad():
        for k, t in new_state.items():
            ours[k].copy_(t)
    return model.eval()


def _arch_of(model: nn.Module) -> str:
    if isinstance(model, FunnelModel):
        return "FunnelModel" if model.decoder is not None else "FunnelBaseModel"
    for name, (cls, _) in _ARCHS.items():
        if type(model) is cls:
            return name
    raise CheckpointError(f"cannot save a {type(model).__name__} in HF Funnel layout")


def save_hf_funnel(model: nn.Module, directory: str | os.PathLike) -> Path:
    """Write ``model`` as an HF Funnel checkpoint (config.json + model.safetensors)."""
    arch = _arch_of(model)
    config: FunnelConfig = model.config  # type: ignore[assignment]
    if arch == "FunnelForMaskedLM" and config.mlm_transform:
        raise CheckpointError(
            "HF's FunnelForMaskedLM head has no dense/LN transform; this model has "
            "mlm_transform=True and cannot be saved in HF layout"
        )
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    n_labels = getattr(model, "n_labels", None)
    if arch == "FunnelForQuestionAnswering":
        n_labels = 2
    tensors = {}
    for k, t in model.state_dict().items():
        if arch == "FunnelForMaskedLM" and k == "head.decoder.weight":
            continue  # tied to the word embedding; HF re-ties on load
        tensors[hf_key(k, arch)] = t.detach().contiguous().clone()
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    hf = config_to_hf(config, arch, n_labels)
    atomic_write_bytes(directory / "config.json", json.dumps(hf, indent=2).encode())
    return directory
