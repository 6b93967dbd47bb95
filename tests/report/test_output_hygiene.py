"""Text from logs, paths and node names is data: fed through every output, it is never read as
Rich markup, never reaches a terminal as a control sequence, never becomes HTML.

Hostile lines: Rich markup (``[/dev/nvidia3]`` crashed replay with a MarkupError, ``[error]``
vanished, ``[/bold]`` in a path crashed the error printer), ANSI/OSC escape sequences (ESC[2J
clears the operator's screen, OSC 0 retitles the terminal, OSC 8 hides a link), the 8-bit CSI
``\\x9b``, bidi overrides, and ``<script>``.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from recovery_logs.cli import main
from recovery_logs.records import ActionProposal, Evidence, Incident
from recovery_logs.report.terminal import IncidentPanel, incident_line
from recovery_logs.textsafe import clean, json_dumps, md_code_block, md_text, out_console

RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
XID = ("2026-11-29T14:06:00.123456+00:00 gpu-n01 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python "
       "[/dev/nvidia3] GPU has fallen off the bus. [error] \x1b[2J\x1b]0;pwned\x07 \x9b31m <script>alert(1)</script> "
       "\u202eevil ```\n")
# the bundled IB incident's line that lost its "[error]" (mlx5_core logs its severity in brackets)
IB = "2026-11-29T14:06:01.000000+00:00 gpu-n01 kernel: mlx5_core 0000:3b:00.0: Port module event: module 0, Cable unplugged [error]\n"


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    d = tmp_path / "logs" / "nodes" / "gpu-n01"
    d.mkdir(parents=True)
    (d / "kern.log").write_text(XID + IB, encoding="utf-8")
    return tmp_path / "logs"


def test_clean_escapes_controls_and_keeps_text():
    assert clean("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert clean("\x9b31m") == "\\x9b31m" and clean("\u202eevil") == "\\u202eevil"
    assert clean("tab\tand\nnewline [/bold] <b>") == "tab\tand\nnewline [/bold] <b>"
    assert RAW_CONTROL.search(clean("".join(chr(c) for c in range(0x00, 0xA0)))) is None


def test_json_stays_json_with_every_control_escaped():
    s = json_dumps({"m": "\x1b[2J\x9b\u202e\u2028"})
    assert RAW_CONTROL.search(s) is None and "\u2028" not in s
    assert json.loads(s) == {"m": "\x1b[2J\x9b\u202e\u2028"}


def test_markdown_helpers_cannot_break_out():
    assert md_text("<script>|`x`") == "&lt;script&gt;\\|\\`x\\`"
    block = md_code_block(["a ``` b", "c"])
    assert block[0] == "````" and block[-1] == "````"


def test_replay_prints_hostile_log_text_literally(hostile_dir: Path, tmp_path: Path, capsys):
    out = tmp_path / "out"
    assert main(["replay", str(hostile_dir), "--out", str(out)]) == 0       # stdout is a pipe here, not a tty
    cap = capsys.readouterr()
    assert "MarkupError" not in cap.err and RAW_CONTROL.search(cap.out) is None
    assert "[/dev/nvidia3]" in cap.out and "Cable unplugged [error]" in cap.out
    assert "\\x1b[2J\\x1b]0;pwned\\x07" in cap.out
    assert max(len(ln) for ln in cap.out.splitlines()) > 80          # piped: not cut to 80 columns

    md = (out / "report.md").read_text(encoding="utf-8")
    assert RAW_CONTROL.search(md) is None and "\\x1b[2J" in md
    # outside code blocks no raw HTML; inside, the fence is longer than any backtick run of the line
    fences = re.findall(r"^(`{3,})$", md, flags=re.M)
    assert fences and all(len(f) == 4 for f in fences)
    outside = re.sub(r"^````\n.*?^````$", "", md, flags=re.M | re.S)
    assert "<script>" not in outside
    html = (out / "report.html").read_text(encoding="utf-8")
    assert RAW_CONTROL.search(html) is None and "<script>alert" not in html and "&lt;script&gt;" in html
    data = json.loads((out / "incidents.json").read_text(encoding="utf-8"))
    msgs = [e["message"] for i in data["incidents"] for e in i["evidence"]]
    assert any("\x1b[2J" in m and "[/dev/nvidia3]" in m for m in msgs)       # JSON keeps the data intact

    assert main(["replay", str(hostile_dir), "--json"]) == 0
    js = capsys.readouterr().out
    assert RAW_CONTROL.search(js) is None and json.loads(js)["summary"]["incidents"] >= 1


def test_error_printer_prints_a_markup_path_literally(tmp_path: Path, capsys):
    bad = tmp_path / "x[/bold]y [red]" / "kern\x1b[2J.log"
    assert main(["replay", str(bad)]) == 4
    err = capsys.readouterr().err
    assert "x[/bold]y [red]" in err and "kern\\x1b[2J.log" in err and "\x1b" not in err


def _incident(text: str) -> Incident:
    return Incident(id="inc-hostile00001", category="xid", cause=f"XID 79 {text}", severity="critical",
                    node="gpu-n01", gpu=0, job_id="4117", xid=79, confidence=0.9, first_seen=1_795_000_000 * 10**9,
                    last_seen=1_795_000_005 * 10**9, detected_at=1_795_000_002 * 10**9, count=1, nodes=("gpu-n01",),
                    evidence=(Evidence(1_795_000_000 * 10**9, "gpu-n01", text, "xid.79"),), candidates=(),
                    actions=(ActionProposal("drain_node", "gpu-n01", "record_only", text, "inc-hostile00001"),))


def test_every_terminal_renderer_takes_hostile_text():
    text = XID.strip()
    inc = _incident(text)
    buf = io.StringIO()
    con = out_console(120, file=buf)
    con.print(IncidentPanel(inc, 1))
    con.print(text)                                   # a plain str through the command console
    shown = buf.getvalue()
    assert RAW_CONTROL.search(shown) is None and "[/dev/nvidia3]" in shown and "[error]" in shown
    line = incident_line("new", inc)
    assert RAW_CONTROL.search(line) is None and "\n" not in line and "[/dev/nvidia3]" in line
    # a plain rich Console with markup on would have crashed on the same renderable before
    Console(file=io.StringIO(), width=100).print(IncidentPanel(inc, 1))


def test_help_texts_keep_brackets(capsys):
    assert main(["serve", "-h"]) == 0
    out = capsys.readouterr().out
    assert "[[user]] name, role, token_sha256" in out and "Example:" in out
