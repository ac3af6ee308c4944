"""Model registry and the flat-vector view of a model that the server works with."""

from fedflock.models import language  # noqa: F401  (registers the next-token models)
from fedflock.models.flat import FlatSpec
from fedflock.models.handle import Block, ModelHandle
from fedflock.models.zoo import MODELS, build_model

__all__ = ["MODELS", "Block", "FlatSpec", "ModelHandle", "build_model"]
