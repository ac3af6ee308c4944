"""Privacy mechanisms applied on the client side."""

from fedflock.privacy.masking import PermutationMask

__all__ = ["PermutationMask"]
