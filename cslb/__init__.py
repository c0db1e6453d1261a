"""The ``cslb`` command line: one entry point, each subcommand implemented by its room."""

import importlib.metadata

try:
    __version__ = importlib.metadata.version("cslb")
except importlib.metadata.PackageNotFoundError:  # run from a tree that was never installed
    __version__ = "unknown"
