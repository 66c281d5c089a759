import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that scales a tensor by a constant and adds a constant bias.
    """

    def __init__(self, scale: float, bias: float):
        """
        Args:
            scale (float): Multiplier applied to every element.
            bias (float): Constant added after scaling.
        """
        super(Model, self).__init__()
        self.scale = scale
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of any shape.

        Returns:
            torch.Tensor: x * scale + bias, same shape as x.
        """
        return x * self.scale + self.bias


batch_size = 16
dim = 4000
scale = 1.7
bias = -0.3


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return [scale, bias]
