"""CLI command groups; each module exposes ``register(app)`` (discovered by recovery_logs.cli)."""
