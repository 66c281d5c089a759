"""Variable-length attention for packed rows (``learner.pack``), as a transformers attention implementation.

With sdpa, transformers masks a packed row with a dense [L, L] boolean mask (``kforge.learner.packing``):
its memory grows with the square of the row, sdpa cannot take its flash kernel with a mask, and every
sample's queries are still scored against every other sample's keys before the mask drops them.
``install`` replaces the model's "sdpa" with "kforge_varlen", which for a packed row without padding
runs causal attention per sample span:

- on a GPU with bf16/fp16 activations: ``torch.nn.attention.varlen.varlen_attn`` (torch's own flash
  kernel over cumulative sequence lengths), when this torch has it (2.9 on; both of its call forms);
- elsewhere (or with attention dropout): sdpa with ``is_causal`` on each span in turn (the same numbers
  as the dense mask).

The spans come from the ``cu_seq_lens_q``/``max_length_q`` keyword arguments that ``collate_packed``
passes to the model's forward (transformers hands them down to every attention layer, and a
recomputed layer gets them again); every packed row carries them. Everything else (a
padding mask, a KV cache, generation) goes to transformers' sdpa unchanged, so a rollout backend
sharing the model generates exactly as before. Models with sliding windows keep sdpa (``install``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch
from torch import Tensor

NAME = "kforge_varlen"
Kernel = Callable[..., Tensor]  # torch's varlen_attn, whose call form changed across torch releases
_HALF = (torch.float16, torch.bfloat16)


@functools.cache  # asked at every attention layer of every forward: a failed import is not retried
def _torch_varlen() -> Kernel | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch before 2.9
        return None
    return varlen_attn


def _kernel(q: Tensor) -> Kernel | None:
    """torch's variable-length flash attention where it runs (CUDA, half precision), else None."""
    return _torch_varlen() if q.is_cuda and q.dtype in _HALF else None


@functools.lru_cache(maxsize=4)
def _parameters(kernel: Kernel) -> frozenset[str]:
    return frozenset(inspect.signature(kernel).parameters)


def _call_kernel(kernel: Kernel, q: Tensor, k: Tensor, v: Tensor, cu: Tensor, longest: int,
                 scaling: float | None) -> Tensor | None:
    """Causal ``kernel`` over the spans, across the forms torch's varlen_attn has had: ``is_causal`` and no
    scale or GQA at first (torch 2.9), then keyword ``window_size``, ``scale`` and ``enable_gqa``. None
    when this torch's form cannot express the call (the caller runs sdpa per span instead)."""
    params = _parameters(kernel)
    if "window_size" in params:
        kwargs: dict[str, Any] = {"window_size": (-1, 0)}  # causal
    elif "is_causal" in params:
        kwargs = {"is_causal": True}
    else:
        return None
    if "scale" in params:
        kwargs["scale"] = scaling
    elif scaling is not None and abs(scaling - q.shape[-1] ** -0.5) > 1e-6 * scaling:
        return None  # a non-default scale this form cannot take
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:  # each key/value head serves heads / kv_heads query heads, in order
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
    return kernel(q, k, v, cu, cu, longest, longest, **kwargs)


def spans(kwargs: dict, batch: int, device: torch.device) -> tuple[Tensor, int] | None:
    """(cumulative span starts [n + 1] int32, longest span) of a packed row, from the lengths `collate_packed`
    passes, or None when each row is one sequence (plain causal attention)."""
    cu, longest = kwargs.get("cu_seq_lens_q"), kwargs.get("max_length_q")
    if cu is not None and batch == 1:  # collate_packed's one row
        return cu.to(device=device, dtype=torch.int32), int(longest)
    return None


def _per_span(q: Tensor, k: Tensor, v: Tensor, cu: Tensor, scaling: float | None, dropout: float = 0.0) -> Tensor:
    """Causal sdpa on each span of [T, H, D] tensors in turn."""
    gqa = q.shape[1] != k.shape[1]
    out = []
    bounds = cu.tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        o = torch.nn.functional.scaled_dot_product_attention(
            q[a:b].transpose(0, 1), k[a:b].transpose(0, 1), v[a:b].transpose(0, 1),
            is_causal=True, scale=scaling, enable_gqa=gqa, dropout_p=dropout,
        )
        out.append(o.transpose(0, 1))
    return torch.cat(out)


def varlen_attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                             attention_mask: Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                             **kwargs: Any) -> tuple[Tensor, None]:  # noqa: ANN401 - transformers' attention kwargs, passed on
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, length, dim = query.shape
    plain = attention_mask is not None or key.shape[2] != length or length == 1
    found = None if plain else spans(kwargs, batch, query.device)
    if found is not None and (kwargs.get("sliding_window") is not None or kwargs.get("softcap") is not None):
        # sdpa without a mask would let the row's samples see each other: refuse rather than leak.
        raise ValueError("kforge_varlen: a packed row with a sliding window or soft-capping; "
                         "set learner.pack=false for this model")
    if found is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    cu, longest = found
    # [B, H, L, D] -> [B * L, H, D], the layout of variable-length kernels.
    q, k, v = (t.transpose(1, 2).reshape(batch * length, t.shape[1], dim) for t in (query, key, value))
    kernel = _kernel(q) if dropout == 0 else None  # torch's varlen_attn has no dropout
    out = _call_kernel(kernel, q, k, v, cu, longest, scaling) if kernel is not None else None
    if out is None:
        out = _per_span(q, k, v, cu, scaling, dropout)
    return out.reshape(batch, length, heads, dim), None


def _mask(*args: Any, attention_mask: Tensor | None = None, **kwargs: Any) -> Tensor | None:  # noqa: ANN401 - sdpa_mask's, passed on
    """No mask for a forward without padding and without a cache (queries = keys, from position 0): a
    packed row's spans reach attention apart. sdpa's own mask for everything else (padding, a KV cache)."""
    from transformers.masking_utils import sdpa_mask

    q_length, kv_length = kwargs.get("q_length"), kwargs.get("kv_length")
    if attention_mask is None and q_length is not None and q_length == kv_length \
            and not kwargs.get("q_offset") and not kwargs.get("kv_offset"):
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, varlen_attention_forward)
    AttentionMaskInterface.register(NAME, _mask)


def install(model: torch.nn.Module) -> bool:
    """Switch a causal LM (or a PEFT model around one) from sdpa to kforge_varlen; False, unchanged, when
    it runs another attention (eager and flash-attention handle packed rows themselves) or has sliding
    windows (whose masks come from sdpa's mask, which a row without padding skips here)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    if getattr(config, "sliding_window", None) is not None or getattr(config, "use_sliding_window", False) \
            or "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return False
    register()
    base.set_attn_implementation(NAME)
    return base.config._attn_implementation == NAME
