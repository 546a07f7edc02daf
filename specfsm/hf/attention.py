"""Grouped-query attention whose verify reads the cache once: ``group_attention``.

Models with grouped-query attention (SmolLM2-135M: 9 query heads sharing 3 key/value
heads) keep one cached key and value per group. transformers' ``sdpa`` attention hands
them to ``scaled_dot_product_attention`` as they are where it can: for a decode (one
query row, ``pack_gqa``) and for a forward without a mask (``enable_gqa``). A forward of
several rows over a cache needs a mask (a verify, a tree, a batch with holes), and there
it copies every layer's cached keys and values once per query head of the group
(``repeat_kv``) before attending: at 900 tokens of context SmolLM2 writes about 120 MB a
forward, which on one CPU thread costs a verify 10-20 ms on top of a 53 ms decode.

``group_attention(model)`` gives the model an attention implementation that, for exactly
that case (several query rows, a mask shared by the heads), lays each group's query heads
one after the other as the rows of one head and tiles the mask to match, so the one
``scaled_dot_product_attention`` call attends every query row to its group's keys and
values as they are cached: the same rows, masks and softmax as ``repeat_kv``'s, in
another order of rows (the sum per row is unchanged; greedy identity is checked on every
output as before). Every other call goes to transformers' ``sdpa`` unchanged. Only a
model on ``sdpa`` changes; ``load_model`` groups by default (``attention="stock"`` keeps
transformers' own), so every method a comparison runs evaluates the same attention.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ATTENTION", "GROUPED", "group_attention", "ungroup_attention", "attention_of"]

#: the choices ``load_model(attention=)`` and ``--attention`` take
ATTENTION = ("grouped", "stock")
#: the attention implementation's name, registered with transformers on first use
GROUPED = "specfsm_grouped_sdpa"


def _grouped_sdpa(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                  dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                  **kwargs: Any) -> tuple[Any, None]:
    """transformers' attention-function signature: the grouped forward where it applies
    (module docstring), transformers' ``sdpa`` everywhere else."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = int(getattr(module, "num_key_value_groups", 1))
    b, heads, rows, dim = query.shape
    if (groups == 1 or rows == 1 or attention_mask is None or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or key.shape[1] * groups != heads or dropout
            or any(kwargs.get(k) is not None for k in ("position_bias", "softcap"))
            or kwargs.get("output_attentions")):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    mb, _, _, width = attention_mask.shape
    mask = attention_mask.expand(mb, 1, rows, width)[:, :, None].expand(mb, 1, groups, rows, width)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(b, key.shape[1], groups * rows, dim), key, value,
        attn_mask=mask.reshape(mb, 1, groups * rows, width), scale=scaling)
    return out.reshape(b, heads, rows, value.shape[-1]).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    if GROUPED not in AttentionInterface._global_mapping:
        AttentionInterface.register(GROUPED, _grouped_sdpa)
        ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED, sdpa_mask)  # sdpa's masks, as sdpa takes them


def group_attention(model: Any) -> bool:
    """Give ``model`` the grouped attention (module docstring) if it is on transformers'
    ``sdpa``; returns whether it now has it. ``ungroup_attention`` undoes it."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl == GROUPED:
        return True
    if impl != "sdpa":
        return False
    _register()
    model.set_attn_implementation(GROUPED)
    return attention_of(model) == "grouped"


def ungroup_attention(model: Any) -> bool:
    """Give a grouped ``model`` transformers' ``sdpa`` back; returns whether it had the
    grouped attention."""
    if attention_of(model) != "grouped":
        return False
    model.set_attn_implementation("sdpa")
    return True


def attention_of(model: Any) -> str:
    """``"grouped"`` when ``model`` has the grouped attention, else ``"stock"``."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return "grouped" if impl == GROUPED else "stock"
