"""fedflock on Flower: the same algorithms and client tasks over Flower's Message API.

`clientapp.app` is a `flwr.clientapp.ClientApp` wrapping `ClientRuntime`; `serverapp.app` is a
`flwr.serverapp.ServerApp` whose main loop drives any fedflock algorithm through `FlowerEngine`.
Clustering state is keyed by the stable `partition-id` of each node, never by Flower's node id.
Importing this package imports flwr; the core of fedflock does not.
"""

import os

# No telemetry or usage statistics from anything fedflock starts.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
