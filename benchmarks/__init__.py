"""Benchmarks, and the published tables: `python -m benchmarks.reproduce`.

The scripts here also run on their own (`python benchmarks/NAME.py`)."""
