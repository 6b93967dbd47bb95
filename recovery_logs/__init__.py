"""recovery-logs: GPU-cluster fault detection and recovery from logs."""

__version__ = "0.1.0"
