"""Client tasks (pure functions of model, local data and config) and the executors running them."""

from fedflock.client.protocol import TrainReply, TrainTask
from fedflock.client.runtime import ClientRuntime

__all__ = ["ClientRuntime", "TrainReply", "TrainTask"]
