"""Building blocks shared by the models: feed-forward, positions, the Transformer block, the
layer stack and its memory policies."""

from .block import TransformerBlock
from .chunked import ChunkedFeedForward, chunked_lm_loss
from .ffn import FeedForward
from .memory import FIFOMemory, MemoryPolicy
from .positions import (
    AxialPositions,
    FactorizedPositions,
    LearnedPositions,
    SinusoidalPositions,
    build_positions,
    sinusoid_table,
)
from .stack import LayerCall, LayerStack, StackOutput, prefix_keys

__all__ = [
    "AxialPositions",
    "ChunkedFeedForward",
    "FIFOMemory",
    "FactorizedPositions",
    "FeedForward",
    "LayerCall",
    "LayerStack",
    "LearnedPositions",
    "MemoryPolicy",
    "SinusoidalPositions",
    "StackOutput",
    "TransformerBlock",
    "build_positions",
    "chunked_lm_loss",
    "prefix_keys",
    "sinusoid_table",
]
