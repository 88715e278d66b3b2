"""effiformer: efficient Transformers behind one interface.

>>> import effiformer
>>> model = effiformer.create_model("vanilla-tiny")
>>> effiformer.list_models("vanilla-*")
['vanilla-base', 'vanilla-small', 'vanilla-tiny']
>>> "routing" in effiformer.list_attentions()
True
"""

from . import attention
from .attention import list_attentions
from .checkpoint import load_model, save_model
from .config import ConfigError, ModelConfig
from .registry import build_model, create_model, get_config, list_models

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ModelConfig",
    "build_model",
    "create_model",
    "attention",
    "get_config",
    "list_attentions",
    "list_models",
    "load_model",
    "save_model",
]
