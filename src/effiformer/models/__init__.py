"""Model families. Each family registers itself when imported from this explicit list."""

from . import transformer  # noqa: F401
from . import transformer_xl, compressive  # noqa: F401
from . import funnel  # noqa: F401
from .base import EffiModel, ModelOutput
from .transformer import Transformer, VanillaConfig

__all__ = ["EffiModel", "ModelOutput", "Transformer", "VanillaConfig"]
