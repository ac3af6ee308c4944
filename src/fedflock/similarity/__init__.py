"""Similarity of client contributions."""

from fedflock.similarity.cosine import cosine_matrix

__all__ = ["cosine_matrix"]
