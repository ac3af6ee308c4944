"""Similarity of client contributions."""

from fedflock.similarity.cosine import (
    cosine_from_gram,
    cosine_matrix,
    gram_matrix,
    update_distance,
)

__all__ = ["cosine_from_gram", "cosine_matrix", "gram_matrix", "update_distance"]
