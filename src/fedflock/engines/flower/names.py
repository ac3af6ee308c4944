"""The Flower message types fedflock uses (a module of its own so that the ClientApp can route
messages without importing the codec, which needs torch)."""

PREFIX = "train."  # every fedflock task: `train.<kind>[__<kind>...]`
JOIN = "__"  # between the kinds of the tasks one message carries (an identifier, as Flower wants)
QUERY = "query"  # the handshake
