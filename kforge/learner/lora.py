"""The trainable policy: a PEFT LoRA adapter on a frozen base model."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from kforge.modelio import peft_wrapping

if TYPE_CHECKING:  # annotations only: the config stack (pydantic), PEFT and transformers are imported where used
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from kforge.config.schema import KforgeConfig


class LearnerError(RuntimeError):
    """A problem with the learner's inputs; the message is one line meant for the user."""


def adapter_folder(path: str | Path) -> Path:
    """An adapter folder, or the ``adapter/`` folder inside a learner checkpoint."""
    folder = Path(path)
    if (folder / "adapter_config.json").is_file():
        return folder
    if (folder / "adapter" / "adapter_config.json").is_file():
        return folder / "adapter"
    raise LearnerError(
        f"model.checkpoint {folder}: no adapter_config.json there or in its adapter/ folder; "
        "point it at a saved adapter or a learner checkpoint"
    )


def load_base(cfg: KforgeConfig, device: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Base model and tokenizer from the config (bf16 on a GPU, fp32 on the CPU, or 4-bit)."""
    from kforge.modelio import ModelLoadError, load_causal_lm, load_tokenizer, resolve_model

    if cfg.model.load_in_4bit and not str(device).startswith("cuda"):
        raise LearnerError("model.load_in_4bit needs a CUDA device (bitsandbytes); set model.load_in_4bit=false on CPU")
    try:
        ref = resolve_model(cfg.model.name, cfg.model.gguf_file)
        tokenizer = load_tokenizer(ref, cfg.model.chat_template, cfg.model.trust_remote_code)
        model = load_causal_lm(
            ref, cfg.model.dtype, device, cfg.model.load_in_4bit, cfg.model.trust_remote_code
        )
    except ModelLoadError as exc:
        raise LearnerError(str(exc)) from None
    return model, tokenizer


def is_quantized(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_quantized", False))


def attach_lora(model: PreTrainedModel | PeftModel, cfg: KforgeConfig) -> PeftModel:
    """Wrap ``model`` with a fresh adapter from ``cfg.lora``, or with the adapter in ``cfg.model.checkpoint``
    (whose own adapter_config.json then decides rank and targets). A model that already is a PeftModel
    is used as it is."""
    from peft import LoraConfig, PeftModel, get_peft_model, prepare_model_for_kbit_training

    if isinstance(model, PeftModel):
        return model
    if is_quantized(model) or cfg.model.load_in_4bit:
        # Casts norms to fp32 and freezes the quantised weights, as QLoRA training needs.
        model = prepare_model_for_kbit_training(
            model,
            use_gradient_checkpointing=cfg.model.gradient_checkpointing,
            gradient_checkpointing_kwargs={"use_reentrant": False},
        )
    if cfg.model.checkpoint:
        with peft_wrapping():
            return PeftModel.from_pretrained(model, str(adapter_folder(cfg.model.checkpoint)), is_trainable=True)
    lora = LoraConfig(
        r=cfg.lora.rank,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules if isinstance(cfg.lora.target_modules, str)
        else list(cfg.lora.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with peft_wrapping():
            return get_peft_model(model, lora)
    except ValueError as exc:
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise LearnerError(
            f"lora.target_modules {cfg.lora.target_modules}: {str(exc).splitlines()[0]}; "
            f"linear layers of this model: {', '.join(names)}"
        ) from None


REFERENCE_ADAPTER = "reference"


def attach_reference(model: PeftModel, checkpoint: str | Path) -> str:
    """Load the adapter a run starts from a second time, frozen, as the KL reference (the starting policy,
    not the bare base model). Returns its adapter name; the trainable adapter stays active."""
    model.load_adapter(str(adapter_folder(checkpoint)), adapter_name=REFERENCE_ADAPTER, is_trainable=False)
    return REFERENCE_ADAPTER


def has_dropout(model: torch.nn.Module) -> bool:
    """Any active dropout in train mode (LoRA dropout, or the base model's own)."""
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def enable_gradient_checkpointing(model: PreTrainedModel | PeftModel, share: float = 1.0) -> int:
    """Recompute the activations of `share` of the decoder layers in the backward pass; returns how many.

    Recomputing a layer costs one more forward of it (a third of its training FLOPs) and saves its stored
    activations. Where memory allows, a share below 1 keeps the other layers' activations and spends that
    forward only where memory needs it. The layers that keep theirs are the last ones: their backward
    runs first, so what they hold is freed first. Non-reentrant checkpointing needs no input grads, which a
    frozen embedding would not provide."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.2x name
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    # config.use_cache stays as it is: the learner passes use_cache=False itself, and a rollout backend
    # sharing this model in-process still wants its KV cache when generating.
    layers = checkpointed_layers(base)
    keep = len(layers) - round(share * len(layers))
    for layer in layers[len(layers) - keep:]:
        layer.gradient_checkpointing = False  # the instance attribute overrides the one set for all layers
    return len(layers) - keep


def checkpointed_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's layers that recompute in backward, in forward order (transformers' own flag per layer)."""
    return [m for m in model.modules() if _is_layer(m) and m.gradient_checkpointing]


def _is_layer(module: torch.nn.Module) -> bool:
    return any(k.__name__ == "GradientCheckpointingLayer" for k in type(module).__mro__)


def load_adapter_weights(model: PeftModel, folder: str | Path) -> None:
    """Copy the weights of a saved adapter into the model's active adapter (same rank and targets)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    folder = Path(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    current = model.peft_config[model.active_adapter]
    if int(config.get("r", -1)) != int(current.r):
        raise LearnerError(f"adapter {folder}: rank {config.get('r')} differs from the model's rank {current.r}")
    state = load_file(str(folder / "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise LearnerError(f"adapter {folder}: weights for layers this model lacks, e.g. {unexpected[0]}")


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def is_quantized_model(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "hf_device_map", None))


def pad_id_of(tokenizer: PreTrainedTokenizerBase | None, model: torch.nn.Module) -> int:
    """Any valid id works (pads are masked out); prefer the tokenizer's pad, then eos, then 0."""
    for source in (tokenizer, getattr(model, "config", None)):
        for name in ("pad_token_id", "eos_token_id"):
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, list):
                value = value[0] if value else None
            if isinstance(value, int):
                return value
    return 0


def release_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


@contextlib.contextmanager
def bf16_compute(model: torch.nn.Module, device: torch.device, on: bool) -> Iterator[None]:
    """With ``on``, bf16 autocast (``learner.bf16_autocast``): the adapter and AdamW stay fp32 (master weights)
    while the matmuls run in bf16. PEFT casts a LoRA layer's input to the adapter's dtype first; that fp32
    copy would be cast back to bf16 and saved for backward beside the base layer's own input, so the cast
    is off. (A recomputed layer runs with the cast on: the same bf16 values, so the same gradients.)"""
    if not on:
        yield
        return
    from peft.helpers import disable_input_dtype_casting

    with torch.autocast(device.type, dtype=torch.bfloat16), disable_input_dtype_casting(model):
        yield


def save_adapter_folder(model: PeftModel, adapter: str, folder: str | Path, dtype: str | None = None) -> None:
    """``adapter`` as a PEFT folder (adapter_config.json + adapter_model.safetensors); with ``dtype`` (e.g.
    "bfloat16") its weights are cast first: what an engine serving the base in that dtype computes with
    anyway, in half the bytes of the fp32 master weights."""
    extra: dict[str, Any] = {}
    if dtype is not None:
        cast = getattr(torch, dtype)
        marker = f".{adapter}."  # PEFT's keys name the adapter: ...lora_A.<adapter>.weight
        extra["state_dict"] = {k: v.detach().to(cast) if marker in k and v.is_floating_point() else v
                               for k, v in model.state_dict().items()}
    model.save_pretrained(str(folder), safe_serialization=True, selected_adapters=[adapter], **extra)
