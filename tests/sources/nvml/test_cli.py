"""`recovery-logs nvml-agent` through recovery_logs.cli.main: exit codes and output."""

from __future__ import annotations

import json
import sys

import pynvml

import recovery_logs.sources.nvml as nvml_mod
from recovery_logs.cli import main


def test_no_nvml_library_exits_9_with_message(monkeypatch, kit, capsys):
    fake = kit.FakeNvml([], init_error=pynvml.NVMLError_LibraryNotFound())
    monkeypatch.setattr(nvml_mod, "load_nvml", lambda: fake)
    assert main(["nvml-agent", "--once"]) == 9
    err = capsys.readouterr().err
    assert "NVMLUnavailable" in err and "NVML Shared Library Not Found" in err
    assert "Traceback" not in err


def test_driver_not_loaded_exits_9(monkeypatch, kit, capsys):
    fake = kit.FakeNvml([], init_error=pynvml.NVMLError_DriverNotLoaded())
    monkeypatch.setattr(nvml_mod, "load_nvml", lambda: fake)
    assert main(["nvml-agent", "--once"]) == 9
    assert "Driver Not Loaded" in capsys.readouterr().err


def test_bindings_not_installed_exits_9(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    assert main(["nvml-agent", "--once"]) == 9
    assert "nvidia-ml-py" in capsys.readouterr().err


def test_real_pynvml_on_this_host(capsys):
    """On a host without the NVIDIA driver (this CI) the real bindings give exit 9; on a GPU host, 0."""
    try:
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        has_nvml = True
    except pynvml.NVMLError:
        has_nvml = False
    rc = main(["nvml-agent", "--once", "--host", "ci"])
    assert rc == (0 if has_nvml else 9)


def test_once_to_stdout_prints_json_lines(monkeypatch, kit, capsys):
    gpu = kit.FakeGpu("GPU-aaaa-0000", b"00000000:1B:00.0", remap=(0, 1, 1, 0))
    fake = kit.FakeNvml([gpu])
    fake.xid(gpu, 63)
    monkeypatch.setattr(nvml_mod, "load_nvml", lambda: fake)
    assert main(["nvml-agent", "--once", "--host", "gpu-node-3", "--to", "stdout"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    msgs = [r["_msg"] for r in rows]
    assert "NVML gpu=0 uuid=GPU-aaaa-0000 pci=0000:1b:00.0 remapped_rows pending=1 failure=0 correctable=0 " \
           "uncorrectable=1" in msgs
    assert msgs[-1] == "NVML gpu=0 uuid=GPU-aaaa-0000 pci=0000:1b:00.0 xid=63"
    assert {r["host"] for r in rows} == {"gpu-node-3"} and {r["unit"] for r in rows} == {"nvml"}
    assert fake.shutdown_called


def test_bad_options_exit_2(monkeypatch, kit):
    monkeypatch.setattr(nvml_mod, "load_nvml", lambda: kit.FakeNvml([kit.FakeGpu("GPU-a", b"0000:01:00.0")]))
    assert main(["nvml-agent", "--once", "--to", "kafka://x"]) == 2
    assert main(["nvml-agent", "--once", "--interval", "soon"]) == 2
    assert main(["nvml-agent", "--once", "--interval", "0s"]) == 2


def test_once_to_victorialogs_posts_json_lines(monkeypatch, kit):
    """A real HTTP server on 127.0.0.1 stands in for VictoriaLogs' /insert/jsonline."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    got: list[tuple[str, bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            got.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        gpu = kit.FakeGpu("GPU-aaaa-0000", b"00000000:1B:00.0")
        fake = kit.FakeNvml([gpu])
        fake.xid(gpu, 79)
        monkeypatch.setattr(nvml_mod, "load_nvml", lambda: fake)
        rc = main(["nvml-agent", "--once", "--host", "n3", "--to", f"victorialogs://127.0.0.1:{server.server_port}"])
    finally:
        server.shutdown()
        server.server_close()
    assert rc == 0
    assert all(path.startswith("/insert/jsonline") for path, _ in got)
    rows = [json.loads(line) for _, body in got for line in body.decode().splitlines()]
    assert rows[-1]["_msg"] == "NVML gpu=0 uuid=GPU-aaaa-0000 pci=0000:1b:00.0 xid=79"
    assert {r["host"] for r in rows} == {"n3"} and rows[-1]["gpu"] == "0" and rows[-1]["pci"] == "0000:1b:00.0"
