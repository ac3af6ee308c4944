"""Privacy mechanisms applied on the client side."""

from fedflock.privacy.dp import ClientDP
from fedflock.privacy.masking import PermutationMask

__all__ = ["ClientDP", "PermutationMask"]
