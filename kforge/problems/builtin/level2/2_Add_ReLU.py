import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Model that adds two tensors and applies ReLU to the sum.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of any shape.
            y (torch.Tensor): Input tensor of the same shape as x.

        Returns:
            torch.Tensor: relu(x + y), same shape as the inputs.
        """
        x = x + y
        x = torch.relu(x)
        return x


batch_size = 16
dim = 4000


def get_inputs():
    x = torch.randn(batch_size, dim)
    y = torch.randn(batch_size, dim)
    return [x, y]


def get_init_inputs():
    return []  # No special initialization inputs needed
