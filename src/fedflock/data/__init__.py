"""Dataset readers and heterogeneity scenarios."""

from fedflock.data.datasets import DATASETS, Dataset, load_dataset
from fedflock.data.scenarios import (
    SCENARIO_DOCS,
    SCENARIOS,
    ClientData,
    FederatedData,
    SampleReuseWarning,
    build_federated_data,
)

__all__ = [
    "DATASETS",
    "SCENARIOS",
    "SCENARIO_DOCS",
    "ClientData",
    "Dataset",
    "FederatedData",
    "SampleReuseWarning",
    "build_federated_data",
    "load_dataset",
]
