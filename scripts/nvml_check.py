#!/usr/bin/env python3
"""Real-GPU check for the NVML agent: print everything it reads from each GPU on this host.

    python scripts/nvml_check.py [--wait-ms 2000] [--polls 2]

For each GPU: name, UUID, PCI id, XID event registration, every reading of the agent (raw
values, or the NVML error a reading gave), then the events the agent emits for a first poll,
for a second poll (should be empty or small: change-only), and any XID events within
``--wait-ms``. Exit 0 on success, 9 with a one-line message when this host has no NVML
(no driver, no GPU, or the bindings are missing), 1 on any other failure.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time


def _fmt(value: object) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wait-ms", type=int, default=2000, help="how long to wait for XID events")
    ap.add_argument("--polls", type=int, default=2, help="polls to run (the 2nd shows change-only emission)")
    args = ap.parse_args(argv)

    from recovery_logs.errors import NVMLUnavailable
    from recovery_logs.sources.nvml import NvmlAgent, load_nvml

    host = socket.gethostname().split(".")[0]
    try:
        nvml = load_nvml()
        agent = NvmlAgent(nvml, host=host)
    except NVMLUnavailable as exc:
        print(f"nvml_check: NVML unavailable on {host}: {exc}", file=sys.stderr)
        return 9
    with agent:
        def opt(fn: str, *a: object) -> object:
            try:
                return getattr(nvml, fn)(*a)
            except Exception as exc:  # noqa: BLE001 - report what the driver said, keep going
                return f"<{type(exc).__name__}: {exc}>"

        print(f"host: {host}")
        print(f"pynvml: {getattr(nvml, '__file__', nvml)}")
        print(f"driver_version: {opt('nvmlSystemGetDriverVersion')}")
        print(f"nvml_version: {opt('nvmlSystemGetNVMLVersion')}")
        print(f"cuda_driver_version: {opt('nvmlSystemGetCudaDriverVersion')}")
        print(f"gpus: {len(agent.devices)}")
        print(f"xid_event_set: {'open' if agent._event_set is not None else 'unavailable'}")
        for dev in agent.devices:
            h = dev.handle
            print(f"\n== gpu {dev.index}")
            print(f"  name: {opt('nvmlDeviceGetName', h) if h is not None else '<no handle>'}")
            if h is not None:
                mask = opt("nvmlDeviceGetSupportedEventTypes", h)
                print(f"  supported_event_types: {hex(mask) if isinstance(mask, int) else mask}")
                print(f"  ecc_mode (current, pending): {opt('nvmlDeviceGetEccMode', h)}")
            print(f"  xid_events_registered: {agent.xid_supported.get(dev.index)}")
            for key, value in agent.read_device(dev.index).items():
                print(f"  {key}: {_fmt(value)}")
        first = None
        for i in range(max(1, args.polls)):
            t0 = time.perf_counter()
            events = agent.poll_once()
            first = events if first is None else first
            ms = (time.perf_counter() - t0) * 1000
            print(f"\n== poll {i + 1}: {events.height} events in {ms:.1f} ms")
            for msg in events.get_column("message").to_list():
                print(f"  {msg}")
        print(f"\nunsupported readings: {_fmt({k: sorted(v) for k, v in agent.unsupported.items()})}")
        xids = agent.wait_xid(args.wait_ms)
        print(f"\n== XID events within {args.wait_ms} ms: {xids.height}")
        for msg in xids.get_column("message").to_list():
            print(f"  {msg}")
        print("\n== VictoriaLogs rows for poll 1 would look like:")
        for row in agent.vl_rows(first.head(3)):
            print(f"  {_fmt(row)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
