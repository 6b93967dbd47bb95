"""The CLI's direct dispatch of ``replay`` and ``demo`` (cli._direct, issue 16 start-up) does what
typer does: the same parameters for the same command line, the same output, errors and exit
codes; any command line it does not read plainly goes to typer."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import typer
from hypothesis import given, settings
from hypothesis import strategies as st

from recovery_logs import cli
from recovery_logs.api import bundled_incident
from recovery_logs.cli import _app_for, _direct, main
from recovery_logs.commands import _replay_run as run
from recovery_logs.commands._direct import parse

COMMANDS = {"replay": (run.run_replay, run.REPLAY_OPTIONS, ("paths", "paths")),
            "demo": (run.run_demo, run.DEMO_OPTIONS, ("name", "str"))}
DEMO = str(bundled_incident("xid79_nccl_cascade"))


def _click(name: str):
    return typer.main.get_command(_app_for([name]))


def _kind(func, param) -> str:
    if getattr(param, "is_flag", False):
        return "on"
    if getattr(param, "multiple", False):
        return "strs"
    hint = typing.get_type_hints(func)[param.name]
    base = next(a for a in (typing.get_args(hint) or (hint,)) if a is not type(None))
    if typing.get_origin(base) is list:
        return "paths"
    return {int: "int", Path: "path", str: "str"}[base]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_tables_are_the_typer_commands_options(name):
    func, table, argument = COMMANDS[name]
    cmd = _click(name).commands[name]
    sig = inspect.signature(func)
    # the typer command passes every parameter by name to the function, defaults included
    assert [p.name for p in cmd.params] == list(sig.parameters)
    expect: dict[str, tuple[str, str]] = {}
    for p in cmd.params:
        assert p.default == sig.parameters[p.name].default, p.name
        if p.param_type_name == "argument":
            assert (p.name, _kind(func, p)) == argument
            continue
        kind = _kind(func, p)
        for o in p.opts:
            expect[o] = (p.name, kind)
        for o in p.secondary_opts:
            expect[o] = (p.name, "off")
    assert table == expect


class _Called(Exception):
    pass


def _typer_kwargs(name: str, argv: list[str], monkeypatch, cmd) -> dict | None | str:
    """What the typer command passes to the command's function for ``argv`` (None: it is not called;
    "usage error": typer rejects the line)."""
    got: dict = {}

    def record(**kw):
        got.update(kw)
        raise _Called

    monkeypatch.setattr(run, f"run_{name}", record)
    try:
        cmd.main(args=[name, *argv], prog_name="recovery-logs", standalone_mode=False)
    except _Called:
        return got
    except typer.Exit:
        return None
    except Exception as exc:      # click's usage errors
        assert hasattr(exc, "show") and hasattr(exc, "exit_code"), exc
        return "usage error"
    return None


def _same(direct: dict, func, typer_kw: dict) -> None:
    bound = inspect.signature(func).bind(**direct)
    bound.apply_defaults()
    assert {k: (type(v), v) for k, v in bound.arguments.items()} == {k: (type(v), v) for k, v in typer_kw.items()}


PLAIN = [
    ["replay", DEMO], ["replay", DEMO, "--year", "2026", "--json"], ["replay", "--json", DEMO, "--width=100"],
    ["replay", "a", "b/c", "--no-pushdown", "--progress", "--extra-filter", "x", "--extra-filter=y"],
    ["replay", "--source", "victorialogs://127.0.0.1:9428", "--start", "2026-01-01T00:00:00Z", "--query", "a b",
     "--no-line-scores", "--workers", "0", "--out", "o/r"],
    ["replay"], ["demo"], ["demo", "ib_link_down", "--json"], ["demo", "--list"], ["demo", "--out", "x", "--width", "80"],
]


@pytest.mark.parametrize("argv", PLAIN, ids=[" ".join(a)[:60] for a in PLAIN])
def test_a_plain_command_line_is_read_as_typer_reads_it(argv, monkeypatch):
    name = argv[0]
    func, table, argument = COMMANDS[name]
    direct = parse(argv[1:], table, argument)
    assert direct is not None and _direct(argv) is not None
    typer_kw = _typer_kwargs(name, argv[1:], monkeypatch, _click(name))
    assert isinstance(typer_kw, dict)
    _same(direct, func, typer_kw)


NOT_PLAIN = [["replay", "-h"], ["replay", DEMO, "--help"], ["replay", "--", DEMO], ["replay", "-"],
             ["replay", "--json=1"], ["replay", "--year", "20x6"], ["replay", "--year", "-1"], ["replay", "--host"],
             ["replay", "--jsn"], ["replay", "--progress", "--no-progress"], ["replay", "--host", ""],
             ["demo", "a", "b"], ["demo", "--list", "-V"], ["--version"], ["version"], []]


@pytest.mark.parametrize("argv", NOT_PLAIN, ids=[" ".join(a)[:60] or "(none)" for a in NOT_PLAIN])
def test_anything_else_goes_to_typer(argv):
    assert _direct(argv) is None


def test_a_completion_request_goes_to_typer(monkeypatch):
    monkeypatch.setenv("_RECOVERY_LOGS_COMPLETE", "complete_bash")
    assert _direct(["replay", DEMO]) is None


TOKENS = {
    "str": st.sampled_from(["x", "a b", "a=b", "-x", "", "--json", "é", "0", "*"]),
    "int": st.sampled_from(["0", "7", "2026", "007", "-3", "1.5", "x", "", " 5", "1_0", "+4", "99999999999999999999"]),
    "path": st.sampled_from(["d", "a/b", "./c", "", "-", "~/x", "a b", "/tmp"]),
}


@st.composite
def _lines(draw, name: str):
    _, table, _ = COMMANDS[name]
    out: list[str] = []
    for _ in range(draw(st.integers(0, 6))):
        what = draw(st.sampled_from(["option", "option", "option", "positional", "odd"]))
        if what == "positional":
            out.append(draw(st.sampled_from(["logs", "a/b.log", "x y", "", "ib_link_down"])))
        elif what == "odd":
            out.append(draw(st.sampled_from(["-h", "--help", "--", "-", "--nope", "-V", "--json=1", "--year="])))
        else:
            opt = draw(st.sampled_from(sorted(table)))
            kind = table[opt][1]
            if kind in ("on", "off"):
                out.append(opt)
                continue
            value = draw(TOKENS["str" if kind == "strs" else kind])
            if draw(st.booleans()):
                out.append(f"{opt}={value}")
            elif draw(st.integers(0, 9)):
                out += [opt, value]
            else:
                out.append(opt)       # the value missing (or taken from what follows)
    return out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_generated_command_lines_are_read_as_typer_reads_them_or_left_to_typer(name):
    func, table, argument = COMMANDS[name]
    cmd = _click(name)
    seen = {"direct": 0, "typer": 0}

    @settings(max_examples=250, deadline=None)
    @given(_lines(name))
    def check(argv):
        direct = parse(argv, table, argument)
        with pytest.MonkeyPatch.context() as mp:
            typer_kw = _typer_kwargs(name, argv, mp, cmd)
        if direct is None:
            seen["typer"] += 1
            return
        seen["direct"] += 1
        assert isinstance(typer_kw, dict), (argv, typer_kw)
        _same(direct, func, typer_kw)

    check()
    assert seen["direct"] and seen["typer"]        # both kinds of line were generated


def _main_both_ways(argv: list[str], capsys, monkeypatch) -> tuple[tuple, tuple]:
    """(exit code, stdout, stderr) of ``main(argv)``: dispatched directly, then with typer."""
    assert _direct(argv) is not None
    capsys.readouterr()
    direct = (main(argv), *capsys.readouterr())
    with monkeypatch.context() as mp:
        mp.setattr(cli, "_direct", lambda args: None)
        via_typer = (main(argv), *capsys.readouterr())
    return direct, via_typer


@pytest.mark.parametrize("argv", [["replay", DEMO, "--year", "2026", "--json"], ["demo", "--list"],
                                  ["demo", "ib_link_down", "--json", "--width", "90"]])
def test_direct_and_typer_print_the_same(argv, capsys, monkeypatch):
    direct, via_typer = _main_both_ways(argv, capsys, monkeypatch)
    assert direct == via_typer and direct[0] == 0 and direct[1]


@pytest.mark.parametrize("argv", [["replay"], ["replay", DEMO, "--format", "bogus"], ["replay", "/no/such/dir"],
                                  ["replay", DEMO, "--since", "yesterday"], ["demo", "no-such-incident"],
                                  ["replay", "--source", "victorialogs://127.0.0.1:1", "--start", "x"]])
def test_errors_give_the_same_message_and_exit_code(argv, capsys, monkeypatch):
    direct, via_typer = _main_both_ways(argv, capsys, monkeypatch)
    assert direct == via_typer and direct[0] != 0 and "error:" in direct[2]


def test_an_unreadable_input_gives_the_same_exit_code_both_ways(tmp_path, capsys, monkeypatch):
    d = tmp_path / "logs"
    (d / "nodes" / "gpu-n01").mkdir(parents=True)
    (d / "nodes" / "gpu-n01" / "kern.log").write_text(
        "Nov 29 14:06:05 gpu-n01 kernel: NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")
    (d / "nodes" / "gpu-n02.log.gz").write_bytes(b"\x1f\x8b\x08\x00" + b"\xff" * 64)
    direct, via_typer = _main_both_ways(["replay", str(d), "--year", "2026", "--json"], capsys, monkeypatch)
    assert direct == via_typer and direct[0] == 4 and "gpu-n02.log.gz" in direct[2]


def test_a_closed_stdout_pipe_exits_1_quietly_both_ways():
    code = "import sys; from recovery_logs import cli; {}sys.exit(cli.main(sys.argv[1:]))"
    got = []
    for patch in ("", "cli._direct = lambda args: None; "):       # direct, then through typer
        r, w = os.pipe()
        os.close(r)                                                  # nobody reads: the first write fails
        try:
            p = subprocess.run([sys.executable, "-c", code.format(patch), "replay", DEMO, "--json"], stdout=w,
                               stderr=subprocess.PIPE, timeout=120, check=False)
        finally:
            os.close(w)
        got.append((p.returncode, p.stderr))
    assert got[0] == got[1] == (1, b"")
