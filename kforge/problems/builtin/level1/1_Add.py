import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that adds two tensors element by element.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """
        Args:
            a (torch.Tensor): Input tensor of any shape.
            b (torch.Tensor): Input tensor of the same shape as a.

        Returns:
            torch.Tensor: a + b, same shape as the inputs.
        """
        return a + b


batch_size = 16
dim = 4000


def get_inputs():
    a = torch.randn(batch_size, dim)
    b = torch.randn(batch_size, dim)
    return [a, b]


def get_init_inputs():
    return []  # No special initialization inputs needed
