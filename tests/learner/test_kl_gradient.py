"""The KL penalty's gradient against the exact gradient of KL(pi || ref), by exact enumeration.

A tabular policy over every sequence of T tokens from a vocabulary of V: the expected gradient of the
learner's loss (``regularised_token_loss``, the function the learner calls) is the sum over all V^T
sequences weighted by their probability under the sampling policy, and the exact gradient is autograd's
of sum_s pi(s) log(pi(s) / ref(s)). No sampling noise: the cosines are exact.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from kforge.config.schema import LearnerConfig
from kforge.learner.losses import discounted_future_sum, kl_estimate, kl_log_ratio, kl_loss, regularised_token_loss

V, T = 3, 3
SEQS = torch.tensor(list(itertools.product(range(V), repeat=T)))  # [V^T, T]


def prefix_index(per_position: bool) -> torch.Tensor:
    """[V^T, T]: the table row each token is drawn from: its whole prefix, or only its position."""
    if per_position:
        return torch.arange(T).expand(len(SEQS), T)
    rows = {}
    out = torch.zeros(len(SEQS), T, dtype=torch.long)
    for i, seq in enumerate(SEQS.tolist()):
        for t in range(T):
            out[i, t] = rows.setdefault(tuple(seq[:t]), len(rows))
    return out


def token_logp(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(table, dim=-1)[index, SEQS]


def tables(per_position: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    rows = T if per_position else sum(V**t for t in range(T))
    theta = (torch.randn(rows, V, generator=g, dtype=torch.float64) * 0.8).requires_grad_()
    ref = torch.randn(rows, V, generator=g, dtype=torch.float64) * 0.8
    behaviour = theta.detach() + torch.randn(rows, V, generator=g, dtype=torch.float64) * 0.6
    return theta, ref, behaviour


def exact_gradient(theta, ref, index) -> torch.Tensor:
    logp = token_logp(theta, index).sum(-1)
    kl = (logp.exp() * (logp - token_logp(ref, index).sum(-1))).sum()
    (grad,) = torch.autograd.grad(kl, theta)
    return grad


def expected_gradient(theta, ref, index, sampler, loss_fn, estimator, discount, weighted=True) -> torch.Tensor:
    """E over sequences drawn from ``sampler`` of the gradient of the learner's per-token loss, summed over
    tokens (advantage 0: only the KL acts)."""
    logp = token_logp(theta, index)
    ref_lp = token_logp(ref, index)
    rollout = token_logp(sampler, index).detach()
    mask = torch.ones_like(logp, dtype=torch.bool)
    zero = torch.zeros(len(SEQS), 1, dtype=logp.dtype)
    if estimator == "k1":  # what kforge refuses: the k1 value itself as the loss
        per_token = kl_estimate(logp, ref_lp, "k1")
        future = discounted_future_sum(kl_log_ratio(logp, ref_lp), mask, discount)
        per_token = per_token + future * logp  # the discounted future sum enters through the advantage
    elif weighted:
        tl, _ = regularised_token_loss(loss_fn, logp, logp.detach(), rollout, zero, mask, ref_lp, kl_coef=1.0,
                                       kl_estimator=estimator, kl_discount=discount,
                                       clip_low=0.2, clip_high=0.28, is_clip=1e6)
        per_token = tl.loss
    else:  # the KL term without its importance weight, as before
        per_token = kl_loss(logp, ref_lp, estimator, torch.ones_like(logp))
    prob = rollout.sum(-1).exp()
    (grad,) = torch.autograd.grad((prob[:, None] * per_token).sum(), theta)
    return grad


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0))


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "dr_grpo"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_k2_with_the_future_sum_is_the_exact_kl_gradient_on_policy(loss_fn, seed):
    theta, ref, _ = tables(per_position=False, seed=seed)
    index = prefix_index(per_position=False)
    exact = exact_gradient(theta, ref, index)
    got = expected_gradient(theta, ref, index, theta.detach(), loss_fn, "k2", discount=1.0)
    assert cosine(got, exact) > 0.99
    torch.testing.assert_close(got, exact)  # not only the direction: the gradient itself


def test_k1_as_a_loss_regularises_nothing_and_is_refused():
    theta, ref, _ = tables(per_position=False, seed=0)
    index = prefix_index(per_position=False)
    exact = exact_gradient(theta, ref, index)
    alone = expected_gradient(theta, ref, index, theta.detach(), "importance_sampling", "k1", discount=0.0)
    assert alone.norm() < 1e-9 * exact.norm()  # E_pi[grad log pi] = 0
    with_future = expected_gradient(theta, ref, index, theta.detach(), "importance_sampling", "k1", discount=1.0)
    assert cosine(with_future, exact) < 0.99
    logp = token_logp(theta, index)
    with pytest.raises(ValueError, match="k1 cannot be a loss|k1's expected gradient is 0"):
        kl_loss(logp, token_logp(ref, index), "k1", torch.ones_like(logp))
    with pytest.raises(ValueError, match="k1 cannot be a KL loss"):
        LearnerConfig(kl_estimator="k1")


def test_k3_is_close_but_k2_is_closer():
    theta, ref, _ = tables(per_position=False, seed=0)
    index = prefix_index(per_position=False)
    exact = exact_gradient(theta, ref, index)
    k3 = cosine(expected_gradient(theta, ref, index, theta.detach(), "dr_grpo", "k3", discount=1.0), exact)
    k2 = cosine(expected_gradient(theta, ref, index, theta.detach(), "dr_grpo", "k2", discount=1.0), exact)
    assert 0.8 < k3 < k2 and k2 > 0.99


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "dr_grpo"])
def test_the_kl_term_is_importance_weighted_like_the_policy_term(loss_fn):
    """Tokens drawn by a stale sampler: weighted by min(pi/mu, C) like the policy term, the KL term's
    expected gradient is the exact one (a policy whose rows depend on the position only, so a token's own
    ratio is the whole correction); unweighted it is the gradient under the sampler's distribution."""
    theta, ref, behaviour = tables(per_position=True, seed=3)
    index = prefix_index(per_position=True)
    exact = exact_gradient(theta, ref, index)
    weighted = expected_gradient(theta, ref, index, behaviour, loss_fn, "k2", discount=1.0)
    unweighted = expected_gradient(theta, ref, index, behaviour, loss_fn, "k2", discount=1.0, weighted=False)
    assert cosine(weighted, exact) > 0.99
    torch.testing.assert_close(weighted, exact)
    assert cosine(unweighted, exact) < cosine(weighted, exact) - 0.01
