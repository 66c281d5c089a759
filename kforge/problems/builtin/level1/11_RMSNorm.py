import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that performs RMS Normalization over the last dimension, with a learned scale.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        """
        Args:
            hidden_size (int): Size of the normalized (last) dimension.
            eps (float): Added to the mean square for numerical stability.
        """
        super(Model, self).__init__()
        self.eps = eps
        # Perturbed away from ones so a kernel that ignores the scale is caught.
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, hidden_size).

        Returns:
            torch.Tensor: x / sqrt(mean(x^2) + eps) * weight, same shape as input.
        """
        rms = torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x * rms * self.weight


batch_size = 32
hidden_size = 768


def get_inputs():
    x = torch.randn(batch_size, hidden_size) * 2.0
    return [x]


def get_init_inputs():
    return [hidden_size]
