import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """
    Simple model that performs Layer Normalization over the last dimension, with a learned scale and shift.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5):
        """
        Args:
            hidden_size (int): Size of the normalized (last) dimension.
            eps (float): Added to the variance for numerical stability.
        """
        super(Model, self).__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        # Perturbed away from ones/zeros so a kernel that ignores them is caught.
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden_size))
        self.bias = nn.Parameter(0.1 * torch.randn(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, hidden_size).

        Returns:
            torch.Tensor: Normalized tensor, same shape as input.
        """
        return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps)


batch_size = 32
hidden_size = 768


def get_inputs():
    x = torch.randn(batch_size, hidden_size) * 2.0 + 0.5
    return [x]


def get_init_inputs():
    return [hidden_size]
