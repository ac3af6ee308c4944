"""User-facing errors: one clear line, exit status 2 (never a traceback)."""


class FedflockError(Exception):
    """An error caused by user input (config, data files, run directory)."""

    exit_code = 2


class ConfigError(FedflockError):
    """The configuration is invalid."""


class DataError(FedflockError):
    """A dataset file is missing or malformed."""
