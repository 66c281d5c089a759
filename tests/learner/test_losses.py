"""Each loss on tiny tensors whose values and gradients are worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from kforge.learner.losses import (
    aggregate,
    discounted_future_sum,
    kl_estimate,
    mismatch_rejected,
    reduction_for,
    token_loss,
    truncated_is_weight,
)

CLIP = dict(clip_low=0.2, clip_high=0.28, is_clip=2.0)


def close(actual: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(actual.detach().double(), torch.tensor(expected, dtype=torch.float64))


def leaf(values: list[list[float]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64, requires_grad=True)


@pytest.mark.parametrize("loss_fn", ["ppo", "grpo", "dr_grpo"])
def test_on_policy_surrogate_is_minus_advantage(loss_fn):
    logp = leaf([[-1.0, -2.0]])
    old = logp.detach().clone()
    out = token_loss(loss_fn, logp, old, old.clone(), torch.tensor([[0.5]], dtype=torch.float64), **CLIP)
    close(out.loss, [[-0.5, -0.5]])
    out.loss.sum().backward()
    close(logp.grad, [[-0.5, -0.5]])  # d/dlogp of -r*A at r = 1
    assert not out.clipped.any() and not out.is_clipped.any()


def test_ppo_clip_cuts_the_gradient_only_on_the_clipped_side():
    # ratios 1.5, 1.5, 0.5, 0.5 against advantages +1, -1, -1, +1
    old = torch.zeros(1, 4, dtype=torch.float64)
    logp = leaf([[math.log(1.5), math.log(1.5), math.log(0.5), math.log(0.5)]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
    out = token_loss("ppo", logp, old, old.clone(), adv, **CLIP)
    # +1 @1.5: min(1.5, 1.28) -> 1.28 clipped; -1 @1.5: min(-1.5, -1.28) -> -1.5 not clipped;
    # -1 @0.5: min(-0.5, -0.8) -> -0.8 clipped;  +1 @0.5: min(0.5, 0.8) -> 0.5 not clipped.
    close(out.loss, [[-1.28, 1.5, 0.8, -0.5]])
    assert out.clipped.tolist() == [[True, False, True, False]]
    out.loss.sum().backward()
    # gradient of -r*A w.r.t. logp is -r*A where unclipped, 0 where clipped
    close(logp.grad, [[0.0, 1.5, 0.0, -0.5]])


def test_truncated_importance_weight():
    old = torch.tensor([[math.log(3.0), math.log(0.5), 0.0]])
    rollout = torch.zeros(1, 3)
    weight, clipped = truncated_is_weight(old, rollout, cap=2.0)
    close(weight, [[2.0, 0.5, 1.0]])
    assert clipped.tolist() == [[True, False, False]]


def test_surrogate_is_scaled_by_the_detached_is_weight():
    logp = leaf([[0.0, 0.0]])
    old = logp.detach().clone()
    rollout = torch.tensor([[-math.log(3.0), -math.log(0.5)]], dtype=torch.float64)  # old/rollout = 3, 0.5
    out = token_loss("grpo", logp, old, rollout, torch.tensor([[1.0]], dtype=torch.float64), **CLIP)
    close(out.is_weight, [[2.0, 0.5]])
    assert out.is_clipped.tolist() == [[True, False]]
    close(out.loss, [[-2.0, -0.5]])
    out.loss.sum().backward()
    close(logp.grad, [[-2.0, -0.5]])


def test_importance_sampling_loss_is_truncated_reinforce():
    # ratios to the sampler: 3 (capped at 2), 0.5, 1
    logp = leaf([[math.log(3.0), math.log(0.5), 0.0]])
    rollout = torch.zeros(1, 3, dtype=torch.float64)
    adv = torch.tensor([[2.0]], dtype=torch.float64)
    out = token_loss("importance_sampling", logp, logp.detach(), rollout, adv, **CLIP)
    close(out.loss, [[-4.0, -1.0, -2.0]])  # -min(r, 2) * A
    assert out.is_clipped.tolist() == [[True, False, False]]
    out.loss.sum().backward()
    close(logp.grad, [[-4.0, -1.0, -2.0]])  # -min(r, 2) * A * dlogp


def test_importance_sampling_survives_an_underflowing_ratio():
    """r = exp(logp - rollout) = exp(-200) underflows to 0 in fp32; the old form r * (min(r, C) / r) was
    0/0 = NaN in the loss and its gradient. Now: loss -min(r, C) * A = -0 and gradient -0 * A, both finite."""
    logp = torch.tensor([[-200.0, 0.0]], requires_grad=True)
    rollout = torch.zeros(1, 2)
    out = token_loss("importance_sampling", logp, logp.detach(), rollout, torch.tensor([[1.5]]), **CLIP)
    assert torch.isfinite(out.loss).all()
    torch.testing.assert_close(out.loss.detach(), torch.tensor([[0.0, -1.5]]))
    out.loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1.5]]))


def test_mismatch_rejection_by_geometric_mean_and_token_veto():
    # per-token log ratios old - rollout (rows: sequences; last column masked out in row 0)
    old = torch.tensor([[0.5, 0.5, 9.0], [0.1, -0.1, 0.0], [0.0, -10.0, 0.0], [3.0, 3.0, 3.0]])
    rollout = torch.zeros_like(old)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    has = torch.tensor([[True], [True], [True], [False]])
    # row 0: mean log ratio 0.5 -> geometric mean e^0.5 = 1.65 > 1.5 (the masked 9.0 does not count)
    # row 1: mean 0 -> kept; row 2: mean -10/3 -> 1/28 < 1/1.5, and a token at e^-10 < 1e-4 (veto)
    # row 3: no engine log-probs -> never rejected
    by_mean = mismatch_rejected(old, rollout, mask, has, max_ratio=1.5, token_veto=None)
    assert by_mean.tolist() == [True, False, True, False]
    by_veto = mismatch_rejected(old, rollout, mask, has, max_ratio=None, token_veto=1e-4)
    assert by_veto.tolist() == [False, False, True, False]
    off = mismatch_rejected(old, rollout, mask, has, max_ratio=None, token_veto=None)
    assert not off.any()
    # a looser bound keeps row 0: e^0.5 = 1.65 < 2
    assert mismatch_rejected(old, rollout, mask, has, max_ratio=2.0, token_veto=None).tolist() == [False, False, True, False]


def test_unknown_loss_is_an_error():
    x = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="loss_fn"):
        token_loss("reinforce++", x, x, x, x, **CLIP)


PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0, 0.0], [4.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)


def test_aggregations():
    assert aggregate(PER_TOKEN, MASK, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(PER_TOKEN, MASK, "sequence_mean").item() == pytest.approx((6 / 3 + 4 / 1) / 2)
    assert aggregate(PER_TOKEN, MASK, "constant", const_len=8).item() == pytest.approx(10 / (2 * 8))
    with pytest.raises(ValueError):
        aggregate(PER_TOKEN, MASK, "constant")


@pytest.mark.parametrize("mode", ["token_mean", "sequence_mean", "constant"])
def test_micro_batch_shares_add_up_to_the_whole(mode):
    whole = aggregate(PER_TOKEN, MASK, mode, const_len=8)
    totals = dict(total_tokens=4, total_seqs=2, const_len=8)
    parts = aggregate(PER_TOKEN[:1], MASK[:1], mode, **totals) + aggregate(PER_TOKEN[1:], MASK[1:], mode, **totals)
    assert parts.item() == pytest.approx(whole.item())


def test_constant_reduction_has_no_length_bias():
    # Two responses with the same advantage, 1 and 4 tokens long: per-token gradient weights.
    logp = leaf([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    out = token_loss("dr_grpo", logp, logp.detach(), logp.detach(), torch.ones(2, 1, dtype=torch.float64), **CLIP)
    aggregate(out.loss, mask, "constant", const_len=4).backward()
    assert logp.grad[0, 0].item() == pytest.approx(logp.grad[1, 0].item()) == pytest.approx(-1 / 8)
    logp.grad = None
    out = token_loss("grpo", logp, logp.detach(), logp.detach(), torch.ones(2, 1, dtype=torch.float64), **CLIP)
    aggregate(out.loss, mask, "sequence_mean").backward()
    assert logp.grad[0, 0].item() == pytest.approx(-1 / 2) and logp.grad[1, 0].item() == pytest.approx(-1 / 8)


def test_reduction_choice():
    assert reduction_for("dr_grpo", "token_mean") == "constant"
    assert reduction_for("grpo", "sequence_mean") == "sequence_mean"
    assert reduction_for("ppo", "token_mean") == "token_mean"


def test_kl_estimators():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    assert kl_estimate(logp, ref, "k1").item() == pytest.approx(math.log(2.0))
    # k3 with r = ref/pi = 0.5: 0.5 - log(0.5) - 1
    assert kl_estimate(logp, ref, "k3").item() == pytest.approx(0.5 + math.log(2.0) - 1.0)
    assert kl_estimate(ref, ref, "k3").item() == 0.0


def test_discounted_future_sum():
    values = torch.tensor([[1.0, 2.0, 3.0], [5.0, 7.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    out = discounted_future_sum(values, mask, 0.5)
    close(out, [[0.5 * 2 + 0.25 * 3, 0.5 * 3, 0.0], [0.5 * 7, 0.0, 0.0]])
    assert discounted_future_sum(values, mask, 0.0).abs().sum().item() == 0.0


def test_floored_log_probs_give_finite_losses_and_gradients():
    """A token outside the learner's top-k/top-p set has log-prob -1e4 (the floor). Before: k3 KL was inf,
    the PPO surrogate was 0 * inf = NaN (truncated weight 0 times an infinite ratio), and masking by
    multiplication turned an inf at a pad into NaN."""
    from kforge.learner.losses import aggregate, kl_estimate, token_loss

    floor = -1.0e4
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[floor, -2.0]])  # floored under the weights the batch arrived at, now inside the set
    rollout = torch.tensor([[-1.5, -2.0]])
    for adv in (1.0, -1.0):
        tl = token_loss("ppo", logp, old, rollout, torch.tensor([[adv]]), clip_low=0.2, clip_high=0.2, is_clip=2.0)
        assert torch.isfinite(tl.loss).all() and tl.loss[0, 0] == 0.0  # weight min(exp(old - rollout), C) = 0
        (grad,) = torch.autograd.grad(tl.loss.sum(), logp)
        assert torch.isfinite(grad).all()
    policy = torch.tensor([[floor, -1.0]], requires_grad=True)
    ref = torch.tensor([[-2.0, -1.0]])
    kl = kl_estimate(policy, ref, "k3")
    assert torch.isfinite(kl).all() and kl[0, 0] > 1e6  # large, bounded
    (grad,) = torch.autograd.grad(kl.sum(), policy)
    assert torch.isfinite(grad).all()
    per_token = torch.tensor([[1.0, float("inf")]])
    mask = torch.tensor([[True, False]])
    for mode in ("token_mean", "sequence_mean"):
        assert aggregate(per_token, mask, mode).item() == 1.0


def test_discounted_future_sum_ignores_non_finite_masked_values():
    from kforge.learner.losses import discounted_future_sum

    values = torch.tensor([[1.0, 2.0, float("inf")]])
    out = discounted_future_sum(values, torch.tensor([[True, True, False]]), 0.5)
    assert out.tolist() == [[1.0, 0.0, 0.0]]


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_the_logged_kl_is_k3_whatever_the_loss_estimator(estimator):
    from kforge.learner.losses import regularised_token_loss

    torch.manual_seed(0)
    logp = (torch.randn(2, 5) - 2.0).requires_grad_()
    ref = torch.randn(2, 5) - 2.0
    mask = torch.ones(2, 5)
    _, kl = regularised_token_loss("grpo", logp, logp.detach(), logp.detach(), torch.ones(2, 1), mask, ref,
                                   kl_coef=0.1, kl_estimator=estimator, kl_discount=0.0, clip_low=0.2,
                                   clip_high=0.2, is_clip=2.0)
    assert not kl.requires_grad and torch.equal(kl, kl_estimate(logp.detach(), ref, "k3"))
