"""CLI command groups: each module exposes ``register(app)``; ``cli.py`` discovers them.

The one place where imports between project modules sit inside functions, on purpose: the CLI
imports every command module to build its ``--help``, and the engine with its heavy
dependencies (polars, scikit-learn, matplotlib) takes seconds to import, so each command imports
what it runs when it runs (``recovery-logs approve ID`` answers in half a second).
"""
