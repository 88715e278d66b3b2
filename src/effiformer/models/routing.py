"""Named Routing Transformer configurations (Roy, Saffar, Vaswani, Grangier 2020, arXiv
2003.05997), in the dense ``vanilla`` family: the paper's model is a decoder-only Transformer
whose self-attention is :class:`~effiformer.attention.routing.RoutingConfig`, so no family of its
own is needed (the attention field carries the head mix, ``skip_first``, clusters and windows).

Sources: the released hyper-parameters (google-research ``routing_transformer/sparse_transformer.py``,
``enwik8_local_cluster8k``, ``wikitext103_local_cluster4k``, ``pg19_local_cluster8k``) and the
paper's tables. Shared by all three, as released: post-LN (tensor2tensor's ``basic_params1``:
``layer_postprocess_sequence="dan"``, dropout then residual add then LayerNorm, nothing before a
sublayer and no final norm) with dropout 0.1 on every sublayer's output and on the decoder input
(``layer_prepostprocess_dropout``); a GEGLU feed-forward without biases, its GELU the tanh
approximation (``ffn_layer="geglu"``, ``activation="geglu_tanh"``, ``ffn_bias=False``); the
attention and FFN dropouts of each config (``attention_dropout``, ``relu_dropout``); shared QK in
the routing heads, local blocks of 256 (``query_shape`` = ``memory_flange`` = 256), decay 0.999,
commitment 1e-4, clusters x window fixed as released.

Also as released: no absolute positions (``positions="none"``: ``add_timing_signal`` False) and
relative-position key and value embeddings in both head types (``max_relative_position`` 513:
the token distance in the local heads, the rank inside the sorted window in the routing heads;
:mod:`effiformer.attention.relative`); the token embeddings pass through a dense layer with bias
(``embed_dense``: ``emb_dense``) even when ``embedding_dims`` equals the width; LayerNorm epsilon
1e-6 (``norm_epsilon``); WikiText-103 replaces input tokens by id 0 with probability 0.25
(``token_dropout``: ``target_dropout``) and drops its embeddings with 0.4 before ``emb_dense``
(``embed_dropout``: ``dropout``).

Deviations of these configs from the released models (what the vanilla family does not have):

- token dropout: the official id 0 is tensor2tensor's padding id, which the loss also skips;
  here id 0 is whatever the vocabulary holds there (``token_dropout_id`` chooses another);
- initialisation: tensor2tensor's ``uniform_unit_scaling`` with gain 0.2 for the relative
  tables only (the rest uses the family's ``init``);
- embeddings: tied input/output embeddings (WikiText-103: factorised, ``embed_dim`` 256 with a
  dense layer up to ``dim`` and one back down, as the official ``embedding_dims``; the official
  output layer after that is a separate dense layer, not tied);
- vocabularies: WikiText-103 the word-level 267,735 tokens (Transformer-XL's; the official T2T
  problem ``LanguagemodelWikitext103L4k``); PG-19 the T2T subword vocabulary of about 2^15
  (``approx_vocab_size``);
- training: the released sizes train with the official Adafactor recipe
  (:data:`~effiformer.recipes.ROUTING_RECIPE`, WikiText-103's with weight decay 2e-5), which
  ``effiformer train`` picks by name.

``routing-tiny`` (tests) and ``routing-small`` (vanilla-small's size, for CPU comparisons) are ours.
``routing-small`` keeps the paper's local blocks of 256, so at its own ``seq_len`` of 256 its local
heads see the whole segment; ``benchmarks/routing_vs_vanilla.py`` sets ``--window 64`` there, and
``effiformer bench routing-small`` times it at 4k-16k tokens, where blocks of 256 are local.
"""

from __future__ import annotations

from ..attention.routing import RoutingConfig
from ..recipes import ROUTING_RECIPE, ROUTING_WT103_RECIPE, register_model_recipe
from ..registry import register_model
from .transformer import VanillaConfig

__all__: list[str] = []

#: what every released configuration shares (see the module docstring)
_RELEASED = dict(
    norm_first=False, activation="geglu_tanh", ffn_bias=False, positions="none", norm_eps=1e-6,
    embed_dense=True,
)  # fmt: skip

register_model(
    "routing-tiny",
    VanillaConfig(
        dim=64, n_heads=2, n_layers=2, seq_len=128, dropout=0.0,
        attention=RoutingConfig(routing_heads=1, skip_first=1, window=32, clusters=4),
    ),
    "2 layers (the first all local), d 64, 1 local + 1 routing head, 4 clusters: for tests",
)  # fmt: skip
register_model(
    "routing-small",
    VanillaConfig(
        dim=256, n_heads=4, n_layers=4, seq_len=256, dropout=0.1,
        attention=RoutingConfig(routing_heads=2, window=256),
    ),
    "vanilla-small's size (4 layers, d 256, ffn 1024): 2 local heads (blocks of 256, the "
    "paper's) + 2 routing heads, sqrt(seq_len) clusters; for long-sequence CPU comparisons",
)  # fmt: skip
register_model(
    "routing-enwik8",
    VanillaConfig(
        vocab_size=256, dim=1024, n_heads=8, n_layers=12, ffn_dim=3072, seq_len=8192,
        dropout=0.1, attn_dropout=0.0, ffn_dropout=0.0, **_RELEASED,
        attention=RoutingConfig(
            routing_heads=4, window=256, clusters=16, cluster_window=512,
            max_relative_position=513,
        ),
    ),
    "enwik8_local_cluster8k: 12L d1024 post-LN, GEGLU 3072, 4 local + 4 routing heads, 16 "
    "clusters x 512, blocks of 256, 8k context, sublayer dropout 0.1 (paper: 0.99 bpc)",
)  # fmt: skip
register_model(
    "routing-wikitext103",
    VanillaConfig(
        vocab_size=267735, dim=1024, embed_dim=256, n_heads=16, n_layers=14, ffn_dim=3072,
        seq_len=4096, dropout=0.1, attn_dropout=0.4, ffn_dropout=0.4, embed_dropout=0.4,
        token_dropout=0.25, **_RELEASED,
        attention=RoutingConfig(
            routing_heads=8, window=256, clusters=8, cluster_window=512,
            max_relative_position=513,
        ),
    ),
    "wikitext103_local_cluster4k: 14L d1024 (embeddings 256) post-LN, GEGLU 3072, 8 local + 8 "
    "routing heads, 8 clusters x 512, blocks of 256, 4k context, attention and FFN dropout 0.4 "
    "(paper: 15.8 ppl)",
)  # fmt: skip
register_model(
    "routing-pg19",
    VanillaConfig(
        vocab_size=32768, dim=1032, n_heads=8, n_layers=22, ffn_dim=4096, seq_len=8192,
        dropout=0.1, attn_dropout=0.0, ffn_dropout=0.0, **_RELEASED,
        attention=RoutingConfig(
            routing_heads=2, skip_first=21, window=256, clusters=16, cluster_window=512,
            max_relative_position=513,
        ),
    ),
    "pg19_local_cluster8k: 22L d1032 (8 x 129), 6 local + 2 routing heads in the last layer "
    "only (skip_first 21), 16 clusters x 512, 8k context (paper: 33.2 test ppl)",
)  # fmt: skip

register_model_recipe("routing-enwik8", ROUTING_RECIPE)
register_model_recipe("routing-pg19", ROUTING_RECIPE)
register_model_recipe("routing-wikitext103", ROUTING_WT103_RECIPE)
