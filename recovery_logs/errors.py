"""The one exception tree of recovery-logs, and the exit codes the CLI maps them to.

::

    RecoveryLogsError                 exit 1   base; never raised directly
    ├── EvalFloorMissed               exit 1   `eval` missed a configured quality floor
    ├── ConfigError                   exit 2   bad option, bad config file, conflicting flags
    ├── InputError                    exit 4   unreadable file, no events at all (names file and line)
    ├── RulePackError                 exit 5   a pack that does not load, compile or pass its examples
    ├── ModelError                    exit 6   model file missing, checksum mismatch, untrusted types
    │   └── TrainingDataError         exit 6   too little / unusable data to train
    ├── SourceError                   exit 7   a log backend failed (read, tail, insert)
    │   └── VictoriaLogsError         exit 7   carries the HTTP status, the query and the server's message
    ├── SlurmError                    exit 8   a Slurm command failed (carries argv, rc, stderr)
    │   └── SlurmUnavailable          exit 8   slurmctld / slurmdbd cannot be reached
    ├── UnsafeTargetError             exit 10  a node name, job id or reason failed validation
    ├── PolicyError                   exit 11  policy file invalid, unknown mode
    ├── AuditError                    exit 12  audit DB cannot be opened or written
    │   └── AuditChainBroken          exit 3   `audit verify` found a changed record (names the first)
    └── NVMLUnavailable               exit 9   no NVIDIA driver / NVML library on this host

Library code raises these (wrapping third-party errors with ``raise ... from exc``); only
``recovery_logs.cli`` prints them and chooses the exit code.
"""

from __future__ import annotations


class RecoveryLogsError(Exception):
    """Base of every error recovery-logs raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, **context: object) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __str__(self) -> str:  # message first, then the context that names what and where
        if not self.context:
            return self.message
        ctx = ", ".join(f"{k}={v!r}" for k, v in self.context.items() if v is not None)
        return f"{self.message} ({ctx})" if ctx else self.message


class EvalFloorMissed(RecoveryLogsError):
    """One or more evaluation floors were missed (CI holds the line on this)."""

    exit_code = 1


class ConfigError(RecoveryLogsError):
    exit_code = 2


class InputError(RecoveryLogsError):
    """A fatal input problem. ``path`` and ``line`` name where."""

    exit_code = 4

    def __init__(self, message: str, path: str | None = None, line: int | None = None, **context: object):
        super().__init__(message, path=path, line=line, **context)
        self.path = path
        self.line = line


class RulePackError(RecoveryLogsError):
    exit_code = 5


class ModelError(RecoveryLogsError):
    exit_code = 6


class TrainingDataError(ModelError):
    exit_code = 6


class SourceError(RecoveryLogsError):
    exit_code = 7


class VictoriaLogsError(SourceError):
    exit_code = 7

    def __init__(self, message: str, status: int | None = None, query: str | None = None,
                 server_message: str | None = None, **context: object):
        super().__init__(message, status=status, query=query, server_message=server_message, **context)
        self.status = status
        self.query = query
        self.server_message = server_message


class SlurmError(RecoveryLogsError):
    exit_code = 8

    def __init__(self, message: str, argv: list[str] | None = None, rc: int | None = None,
                 stderr: str | None = None, **context: object):
        super().__init__(message, argv=argv, rc=rc, stderr=stderr, **context)
        self.argv = argv
        self.rc = rc
        self.stderr = stderr


class SlurmUnavailable(SlurmError):
    exit_code = 8


class UnsafeTargetError(RecoveryLogsError):
    exit_code = 10


class PolicyError(RecoveryLogsError):
    exit_code = 11


class AuditError(RecoveryLogsError):
    exit_code = 12


class AuditChainBroken(AuditError):
    exit_code = 3

    def __init__(self, message: str, record_id: int | None = None, **context: object):
        super().__init__(message, record_id=record_id, **context)
        self.record_id = record_id


class NVMLUnavailable(RecoveryLogsError):
    exit_code = 9


__all__ = [
    "AuditChainBroken", "AuditError", "ConfigError", "EvalFloorMissed", "InputError", "ModelError", "NVMLUnavailable",
    "PolicyError", "RecoveryLogsError", "RulePackError", "SlurmError", "SlurmUnavailable", "SourceError",
    "TrainingDataError", "UnsafeTargetError", "VictoriaLogsError",
]
