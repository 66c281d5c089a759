import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Simple model that sums a tensor over one dimension.
    """

    def __init__(self, dim: int):
        """
        Args:
            dim (int): Dimension to reduce over.
        """
        super(Model, self).__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """
        Args:
            x (torch.Tensor): Input tensor of shape (batch_size, dim1).

        Returns:
            torch.Tensor: Sum over `dim`, that dimension removed.
        """
        return torch.sum(x, dim=self.dim)


batch_size = 32
dim1 = 1000
reduce_dim = 1


def get_inputs():
    x = torch.randn(batch_size, dim1)
    return [x]


def get_init_inputs():
    return [reduce_dim]
