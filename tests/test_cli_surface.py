"""The CLI as an operator meets it: --version, -h everywhere, shell completion, a help text on
every option and an example on every command, one line per incident from `watch` as it happens."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests
import typer

from recovery_logs import __version__
from recovery_logs.cli import app, main
from recovery_logs.cli_help import EXAMPLES


def _commands():
    root = typer.main.get_command(app)

    def walk(c, path):
        if hasattr(c, "commands"):
            for n, sub in c.commands.items():
                yield from walk(sub, [*path, n])
        else:
            yield " ".join(path), c

    return list(walk(root, []))


def test_version_and_short_help(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"recovery-logs {__version__}"
    assert main(["-h"]) == 0
    out = capsys.readouterr().out
    assert "--install-completion" in out and "Commands:" in out
    for path, _ in _commands():
        assert main([*path.split(), "-h"]) == 0, path
        assert "Example:" in capsys.readouterr().out, path


def test_every_option_has_help_and_every_command_an_example():
    cmds = _commands()
    assert len(cmds) >= 20
    for path, c in cmds:
        assert path in EXAMPLES, f"no example for {path!r}"
        assert EXAMPLES[path].startswith(f"recovery-logs {path}"), path
        missing = [p.name for p in c.params if p.param_type_name == "option" and not p.help]
        assert not missing, f"{path}: options without help: {missing}"
    assert set(EXAMPLES) == {p for p, _ in cmds}, "an example names a command that does not exist"


def test_watch_prints_one_line_per_incident_as_it_happens(tmp_path: Path):
    log = tmp_path / "nodes" / "gpu-n05" / "kern.log"
    log.parent.mkdir(parents=True)
    log.write_text("")
    env = {**os.environ, "PYTHONUNBUFFERED": "0"}   # line-buffering is ours, not the interpreter's
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "recovery_logs.cli", "watch", "--source", f"file:{log}",
                          "--for", "60", "--lateness", "0s", "--refresh", "0.2s",
                          "--metrics-bind", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        time.sleep(4)
        now = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        with open(log, "a") as fh:
            fh.write(f"{now}.000000+00:00 gpu-n05 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, "
                     "GPU has fallen off the bus.\n")
        t0 = time.monotonic()
        line = p.stdout.readline()          # arrives while watch keeps running (it runs 60 s)
        took = time.monotonic() - t0
        assert p.poll() is None, p.stderr.read()
        time.sleep(1.0)
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    finally:
        p.terminate()
        p.wait(timeout=20)
    print(f"watch: incident line on stdout {took:.2f} s after the log line was appended")
    assert took < 40 and " NEW " in line and "gpu-n05" in line and "xid" in line, (line, took)
    assert "\x1b" not in line
    assert 'recovery_logs_incidents_reported_total{category="xid",kind="new",severity="critical"} 1.0' in metrics
    assert 'recovery_logs_source_up{source="files"} 1.0' in metrics
    assert f'recovery_logs_build_info{{version="{__version__}"}} 1.0' in metrics


def test_a_command_run_alone_gets_the_same_command_and_help(capsys):
    # main() builds only the named command or group (start-up); its help and parameters are the same
    from recovery_logs.cli import _app_for

    root = typer.main.get_command(app)
    for name, full in root.commands.items():
        one = typer.main.get_command(_app_for([name, "--help"]))
        assert list(one.commands) == [name]
        assert [p.name for p in one.commands[name].params] == [p.name for p in full.params]
        assert main([name, "-h"]) == 0
        alone = capsys.readouterr().out
        try:
            app(args=[name, "-h"], standalone_mode=False)    # the whole app, as before
        except SystemExit:
            pass
        assert alone == capsys.readouterr().out and f" {name} [OPTIONS]" in alone.splitlines()[0]
    for argv in ([], ["-h"], ["--version"], ["no-such-command"]):
        assert _app_for(argv) is app
