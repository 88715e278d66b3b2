"""Other libraries' checkpoint formats: :mod:`.hf_funnel` (HF transformers Funnel-Transformer).

Modules here import the models they convert to; nothing in :mod:`effiformer.models` imports them.
"""

__all__: list[str] = []
