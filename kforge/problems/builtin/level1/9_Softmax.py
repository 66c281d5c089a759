import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that performs a Softmax over the last dimension.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, num_features).

        Returns:
            torch.Tensor: Softmax over dim 1, same shape as input.
        """
        return torch.softmax(x, dim=1)


batch_size = 32
dim = 1000


def get_inputs():
    # Spread the logits so the softmax is far from uniform.
    x = torch.randn(batch_size, dim) * 5.0
    return [x]


def get_init_inputs():
    return []  # No special initialization inputs needed
