"""Model folders written from scratch (config, tokenizer, optional random weights, a random LoRA), so that
benchmarks and GPU checks of the rollout engines run offline with a real architecture and no hub.

The tokenizer is a byte-level BPE trained on the Python standard library's own sources (present on every
machine), with a ChatML chat template. Weights are either left to the engine (vLLM `load_format="dummy"`)
or initialised by transformers and saved, which a log-prob comparison with an HF forward pass needs.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def train_tokenizer(out_dir: str | Path, vocab_size: int = 8000, corpus_bytes: int = 3_000_000) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with `vocab_size` entries saved to `out_dir`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    files: list[str] = []
    total = 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        files.append(str(path))
        total += path.stat().st_size
        if total >= corpus_bytes:
            break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train(files, trainer)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|pad|>"
    )
    hf.chat_template = CHATML
    hf.save_pretrained(str(out_dir))
    return hf


def write_model_folder(
    out_dir: str | Path,
    *,
    arch: str = "llama",
    hidden: int = 512,
    layers: int = 4,
    heads: int = 8,
    kv_heads: int = 8,
    intermediate: int = 1408,
    vocab_size: int = 8000,
    max_positions: int = 4096,
    real_weights: bool = False,
    seed: int = 0,
    dtype: str = "bfloat16",
    tokenizer_from: str | Path | None = None,
    device: str = "cpu",
) -> Path:
    """Config + tokenizer (+ safetensors weights when `real_weights`) of a `arch` model ('llama'|'qwen2').
    `device`: where the random weights are drawn (a 7B shape is drawn in seconds on a GPU, minutes on a CPU)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, Qwen2Config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer_from:
        tok = AutoTokenizer.from_pretrained(str(tokenizer_from))
        tok.save_pretrained(str(out))
    else:
        tok = train_tokenizer(out, vocab_size)
    config_cls = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    config = config_cls(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    config.architectures = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]]
    config.dtype = dtype
    config.save_pretrained(str(out))
    if real_weights:
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        model.save_pretrained(str(out))
    return out


def write_lora(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    rank: int = 16,
    seed: int = 0,
    scale: float = 1.0,
    targets: list[str] | None = None,
    device: str = "cpu",
) -> Path:
    """A PEFT LoRA adapter with random nonzero A and B (so it changes outputs) for the model in `model_dir`.
    Built on a randomly initialised copy of the architecture: only the shapes matter to an adapter."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_dir))
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config)
    lora = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        lora_dropout=0.0,
        target_modules=targets or LORA_TARGETS,
        init_lora_weights=False,  # random A and B: a visible change
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, lora)
    if scale != 1.0:
        with torch.no_grad():
            for name, p in peft_model.named_parameters():
                if "lora_B" in name:
                    p.mul_(scale)
    peft_model.save_pretrained(str(out_dir))
    return Path(out_dir)
