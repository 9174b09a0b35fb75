"""The ``probe`` command line (typer)."""
