"""The ``cslb`` command line: one entry point, each subcommand implemented by its room."""
