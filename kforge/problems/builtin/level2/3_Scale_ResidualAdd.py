import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Model that scales a tensor and adds a residual: x * scaling_factor + residual.
    """

    def __init__(self, scaling_factor: float):
        """
        Args:
            scaling_factor (float): Multiplier applied to x before the residual add.
        """
        super(Model, self).__init__()
        self.scaling_factor = scaling_factor

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, dim).
            residual (torch.Tensor): Tensor of the same shape, added after scaling.

        Returns:
            torch.Tensor: Output tensor of shape (batch_size, dim).
        """
        x = x * self.scaling_factor
        x = x + residual
        return x


batch_size = 16
dim = 4000
scaling_factor = 0.5


def get_inputs():
    x = torch.randn(batch_size, dim)
    residual = torch.randn(batch_size, dim)
    return [x, residual]


def get_init_inputs():
    return [scaling_factor]
