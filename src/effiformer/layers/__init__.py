"""Building blocks shared by the models: feed-forward, positions, the Transformer block."""

from .block import TransformerBlock
from .ffn import FeedForward
from .positions import LearnedPositions, SinusoidalPositions, build_positions, sinusoid_table

__all__ = [
    "FeedForward",
    "LearnedPositions",
    "SinusoidalPositions",
    "TransformerBlock",
    "build_positions",
    "sinusoid_table",
]
