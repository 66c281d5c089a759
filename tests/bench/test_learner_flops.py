"""bench/learner.py's FLOP counts: the 6N figure and the 4N figure a LoRA step really asks for."""

from __future__ import annotations

import pytest


def bench():
    from bench import learner

    return learner


def test_lora_flops_by_the_6n_and_the_4n_count():
    flops = bench().model_flops
    # 100 frozen and 1 LoRA weight over 5 tokens, a head of 10 weights on 2 response positions.
    six, four = flops(frozen=100, trainable=1, head=10, tokens=5, response_tokens=2)
    assert six == 6 * 101 * 5 + 6 * 10 * 2
    assert four == (4 * 100 + 6 * 1) * 5 + 4 * 10 * 2
    # A frozen network costs 2/3 of the 6N count; the trainable share costs the full 6.
    six, four = flops(frozen=10**9, trainable=0, head=0, tokens=7, response_tokens=0)
    assert four / six == pytest.approx(2 / 3)
    six, four = flops(frozen=0, trainable=10**6, head=0, tokens=7, response_tokens=0)
    assert four == six
