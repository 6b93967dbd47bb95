"""Line writers in the formats real systems print.

Scalar helpers (used for the few scripted fault lines) and Polars expressions (used for the bulk
of background lines) produce byte-identical prefixes for the same nanosecond time.

* kernel via rsyslog (RFC3164):  ``Nov 29 14:06:00 gpu-n01 kernel: [12345.678901] NVRM: ...``
* slurmd / slurmctld:            ``[2026-11-29T14:06:00.123] ...``
* PyTorch C++ (c10) logging:     ``[rank3]:[E1129 14:20:16.123456789 ProcessGroupNCCL.cpp:616] ...``
* Python glog-style logging:     ``E1129 14:20:16.123000 140211 torch/.../api.py:869] ...``
* NCCL:                          ``gpu-n01:12345:12401 [3] NCCL WARN ...``
* VictoriaLogs JSON line:        ``{"_time": "...Z", "_msg": ..., "host": ..., "unit": ..., ...}``
"""

from __future__ import annotations

import time as _time

import polars as pl

from recovery_logs.schema import TIME
from recovery_logs.timeutil import NS

MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")

# Which file and which VictoriaLogs unit each stream goes to.
STREAM_UNIT = {"kern": "kernel", "slurmd": "slurmd", "slurmctld": "slurmctld", "job": "train"}


def _tm(t_ns: int) -> tuple[_time.struct_time, int]:
    sec, frac = divmod(int(t_ns), NS)
    return _time.gmtime(sec), frac


def _stamp(tm: _time.struct_time, sep: str = "T") -> str:
    """``2026-11-29T14:06:00`` (``sep`` between date and time)."""
    return (f"{tm.tm_year:04d}-{tm.tm_mon:02d}-{tm.tm_mday:02d}{sep}{tm.tm_hour:02d}:{tm.tm_min:02d}:"
            f"{tm.tm_sec:02d}")


def syslog_prefix(t_ns: int, host: str, boot_ns: int) -> str:
    tm, _ = _tm(t_ns)
    up_s, up_f = divmod(int(t_ns) - int(boot_ns), NS)
    return (f"{MONTHS[tm.tm_mon - 1]} {tm.tm_mday:>2} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} "
            f"{host} kernel: [{up_s:>5}.{up_f // 1000:06d}] ")


def slurm_prefix(t_ns: int) -> str:
    tm, frac = _tm(t_ns)
    return f"[{_stamp(tm)}.{frac // 1_000_000:03d}] "


def glog_cpp(t_ns: int, rank: int, level: str, src: str, msg: str) -> str:
    """PyTorch c10 logging as printed by torch >= 2.2 (nanosecond fraction, rank prefix)."""
    tm, frac = _tm(t_ns)
    return (f"[rank{rank}]:[{level}{tm.tm_mon:02d}{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:"
            f"{tm.tm_sec:02d}.{frac:09d} {src}] {msg}")


def glog_py(t_ns: int, level: str, pid: int, src: str, msg: str) -> str:
    """torch.distributed Python logging (glog layout, microseconds, pid)."""
    tm, frac = _tm(t_ns)
    return (f"{level}{tm.tm_mon:02d}{tm.tm_mday:02d} {tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}."
            f"{frac // 1000:06d} {pid} {src}] {msg}")


def deepspeed_log(t_ns: int, level: str, src: str, msg: str) -> str:
    """DeepSpeed's logger (``deepspeed/utils/logging.py``): ``[2026-11-29 14:06:00,651] [WARNING] [src] msg``."""
    tm, frac = _tm(t_ns)
    return f"[{_stamp(tm, ' ')},{frac // 1_000_000:03d}] [{level}] [{src}] {msg}"


def bracket_time(t_ns: int) -> str:
    """Megatron's ``[2026-11-29 14:06:00]`` prefix."""
    return f"[{_stamp(_tm(t_ns)[0], ' ')}]"


def slurm_clock(t_ns: int) -> str:
    """``2026-11-29T14:06:00`` as slurmstepd prints in CANCELLED banners."""
    return _stamp(_tm(t_ns)[0])


def nccl(host: str, pid: int, tid: int, local_rank: int, msg: str) -> str:
    return f"{host}:{pid}:{tid} [{local_rank}] NCCL {msg}"


# ---- vectorised (Polars) -------------------------------------------------------------------------

def strftime_ns(t: pl.Series, pattern: str, frac_digits: int = 0) -> pl.Series:
    """``strftime`` of whole seconds, computed once per distinct second (lines share seconds), plus
    an optional ``.fraction`` with ``frac_digits`` digits: much faster than per-row formatting."""
    secs = t // NS
    uniq = secs.unique()
    text = pl.select(_dt(pl.lit(uniq) * NS).dt.strftime(pattern)).to_series()
    out = secs.replace_strict(uniq, text, return_dtype=pl.String)
    if frac_digits:
        frac = (t % NS) // (10 ** (9 - frac_digits))
        out = pl.select(pl.concat_str([pl.lit(out), pl.lit("."), pl.lit(frac).cast(pl.String).str.zfill(frac_digits)])
                        ).to_series()
    return out


def _dt(t: pl.Expr) -> pl.Expr:
    return t.cast(pl.Datetime("ns")).dt.replace_time_zone("UTC").cast(TIME)


def syslog_prefix_expr(t: pl.Expr, host: pl.Expr, boot: pl.Expr) -> pl.Expr:
    up = t - boot
    return pl.concat_str([
        _dt(t).dt.strftime("%b %e %H:%M:%S"), pl.lit(" "), host, pl.lit(" kernel: ["),
        (up // NS).cast(pl.String).str.pad_start(5, " "), pl.lit("."),
        ((up % NS) // 1000).cast(pl.String).str.zfill(6), pl.lit("] "),
    ])


def slurm_prefix_expr(t: pl.Expr) -> pl.Expr:
    return pl.concat_str([pl.lit("["), _dt(t).dt.strftime("%Y-%m-%dT%H:%M:%S%.3f"), pl.lit("] ")])


def glog_py_expr(t: pl.Expr, level: str, pid: pl.Expr, src: str) -> pl.Expr:
    return pl.concat_str([pl.lit(level), _dt(t).dt.strftime("%m%d %H:%M:%S%.6f"), pl.lit(" "),
                          pid.cast(pl.String), pl.lit(f" {src}] ")])


def bracket_time_expr(t: pl.Expr) -> pl.Expr:
    return _dt(t).dt.strftime("[%Y-%m-%d %H:%M:%S]")


def rfc3339_expr(t: pl.Expr) -> pl.Expr:
    return _dt(t).dt.strftime("%Y-%m-%dT%H:%M:%S%.9fZ")
