"""A fuzzer over the whole command line, built from the CLI's own declarations.

Every command and option is discovered from the typer app itself (``typer.main.
get_command``), so a command or option added later is fuzzed without a line here.  Each
option's values come from its declared domain (``cli.domains``: a ``Count``'s bounds, a
``Real``'s interval, a ``Choice``'s values, the kind of path it takes) or, for an option
declared without one, from typer's own description of it (choices, ``min``/``max``,
``Path``); to the values inside the domain the fuzzer adds hostile ones: empty text,
unicode digits, inf and nan, numbers just past each bound and far past it (thousands of
digits), negative numbers, terminal markup and emoji codes, names that are not UTF-8, and
paths to files, folders, fifos, /dev/null and /proc (``tests/cli_world``).  Its models
include checkpoints whose tensors are stored in another dtype than their config says (and
in several), and a line runs now and then with a cache of malformed theory constants.

Each command line runs in a private copy of that world, on tiny models, and must keep
the contract of the command line:

* exit 0: no traceback, every result file (.nc) has its report (.html) beside it,
  every file the command names as written exists, and no staging or temporary file
  is left behind;
* exit 2: one line on stderr, ``probe: error: ...``, nothing on stdout, and nothing
  written, changed or removed (but for the finished points a failed sweep keeps, in the
  folder its line names);
* every option an error or warning line names (``--seeds``) is one of the command's own,
  ``--help`` or a word of the line itself (``No such option: --bogus``).

``make test`` runs a fixed budget of derandomised examples per command.
``PROBE_FUZZ=long`` runs ``PROBE_FUZZ_EXAMPLES`` (default 1500) random examples per
command and appends one line per command line to ``PROBE_FUZZ_LOG`` when set.  A
command line that is still running after ``PROBE_FUZZ_TIMEOUT`` seconds (a valid but
long run, e.g. 10^6 epochs) is stopped and counted, not judged.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.main import get_command
from typer.testing import CliRunner

from cli import domains
from cli.app import app
from probe.files import interrupts
from tests.cli_world import copy_world

LONG = os.environ.get("PROBE_FUZZ", "") == "long"
EXAMPLES = int(os.environ.get("PROBE_FUZZ_EXAMPLES", "1500")) if LONG else 6
TIMEOUT = float(os.environ.get("PROBE_FUZZ_TIMEOUT", "60" if LONG else "90"))
#: Seconds a command line may take to stop once its time limit has interrupted it.
GRACE = 30.0
LOG = os.environ.get("PROBE_FUZZ_LOG")

#: Lines a successful command may print on stderr besides nothing.
ALLOWED_STDERR = re.compile(
    r"^(probe: (warning|note): |probe: .* done in [0-9.]+ s|probe: \d+/\d+ steps|"
    r"probe: interrupted after the command had finished; it wrote: |"
    r"fastformer step |gpt2 step |probe: gathered the standard library)"
)
#: Progress lines: a command that fails while it computes (a diverging training run)
#: may have printed them before its one error line.
PROGRESS = re.compile(
    r"^(probe: .* done in [0-9.]+ s|probe: \d+/\d+ steps|fastformer step |gpt2 step )"
)
#: What probe leaves only while it writes (staging, temporary files, the write check).
LEFTOVER = re.compile(r"(\.part$|\.old$|^\.probe-write-check-|\.tmp-\d+$|\.old-\d+$)")
#: A sweep that fails part-way keeps its finished points to resume from, and says where.
KEPT = re.compile(r"\d+ finished points? (?:is|are) kept in (.+), for this command")
#: An option as a line of probe names it: ``--seeds``, ``--branch-scale``.
FLAG = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")


def leaf_commands():
    """(words, click command) for every command of the app, found by walking its tree."""

    def walk(command, words):
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                yield from walk(sub, (*words, name))
        else:
            yield words, command

    return list(walk(get_command(app), ()))


COMMANDS = leaf_commands()


# --- values, from the declarations -------------------------------------------------

HOSTILE_TEXT = ["", " ", "١٢", "٣", "1_000", "0x10", "1e3", "1.5", "+", "-", "inf", "nan",
                "-inf", "NaN", "∞", "１２", "12 ", "\t3", "None", "true", "a" * 300,
                "9" * 5000, "9" * 45, "-" + "9" * 4400, ":-1:", "[bold]x[/bold]",
                os.fsdecode(b"\xff\xfe")]  # fmt: skip


def _ints(low: int, high: int) -> st.SearchStrategy:
    """Values inside [low, high], mostly small (the defaults and the far end of a bound
    are full-size runs), as typed on a command line."""
    small = st.integers(low, max(low, min(high, low + 3)))
    edge = st.sampled_from([v for v in (low, low + 1, 2 * low + 2, 8) if low <= v <= high])
    return st.one_of(small, small, edge).map(str)


def _hostile_ints(low: int, high: int) -> st.SearchStrategy:
    past = [low - 1, low - 2, -1, 0, high, high + 1, 2 * high, 2**63, 2**64, 10**30, -(10**30)]
    return st.one_of(
        st.sampled_from([str(v) for v in past if not low <= v <= high or v == high]),
        st.sampled_from(HOSTILE_TEXT),
        st.integers(10**6, 10**12).map(str),
    )


def _floats(d) -> st.SearchStrategy:
    low = 0.0 if d.low is None else d.low
    high = low + 1.0 if d.high is None else min(d.high, low + 1.0)
    values = st.floats(low, high, exclude_min=d.low_open, exclude_max=d.high_open)
    return values.filter(math.isfinite).map(lambda x: f"{x:.6g}")


def _hostile_floats(d) -> st.SearchStrategy:
    bounds = [d.low, d.high, -1.0, 0.0, 1e308, -1e308]
    past = [b * 2 + 1 for b in (d.low, d.high) if b is not None]
    return st.one_of(
        st.sampled_from(["inf", "-inf", "nan", "1e309", "-1e309", "NaN", "Infinity"]),
        st.sampled_from([repr(float(b)) for b in bounds + past if b is not None]),
        st.sampled_from(HOSTILE_TEXT),
    )


def _pool(world, kind: str, which: str) -> st.SearchStrategy:
    return st.sampled_from(world.get(kind, world["file"])[which])


def value_strategy(param, world, hostile: bool) -> st.SearchStrategy:
    """Text for one value of ``param``: inside its domain, or (``hostile``) outside it."""
    d = domains.domain_of(param)
    if isinstance(d, domains.Count):
        good = _ints(d.low, d.high)
        if d.words:
            good = st.one_of(good, good, st.sampled_from(d.words))
        bad = _hostile_ints(d.low, d.high)
    elif isinstance(d, domains.Real):
        good, bad = _floats(d), _hostile_floats(d)
    elif isinstance(d, domains.Device):
        good = st.just("cpu")
        bad = st.sampled_from(["cuda", "cuda:0", "cuda:7", "mps", "xpu", "meta", "tpu:x", "",
                               "CPU", "cpu:1", "cuda:-1", "cuda:١"])  # fmt: skip
    elif isinstance(d, domains.Choice):
        good = st.sampled_from(d.values)
        bad = st.sampled_from(
            ["", "x", *(v.upper() for v in d.values), *(v + " " for v in d.values)]
        )
    elif isinstance(d, domains.CommaList):
        good = st.one_of(
            st.sampled_from(d.words or d.values),
            st.lists(st.sampled_from(d.values), min_size=1, max_size=3).map(",".join),
        )
        bad = st.sampled_from(["", " , ", ",", "x", f"{d.values[0]},,x", d.values[0].lower() + "x"])
    elif d is not None:
        good = _pool(world, d.kind, "good")
        if d.words:
            good = st.one_of(good, st.sampled_from(d.words))
        bad = st.one_of(_pool(world, d.kind, "bad"), st.sampled_from(HOSTILE_TEXT))
    else:  # declared without a domain: typer's own description
        info = param.type_descriptor.parameter_info
        annotation = param.type_descriptor.annotation
        if param.type_descriptor.is_choice:
            choices = [str(getattr(c, "value", c)) for c in param.type_descriptor.choices]
            good, bad = st.sampled_from(choices), st.sampled_from(["", "x", "nope"])
        elif annotation in (int, float):
            low = info.min if info.min is not None else 0
            high = info.max if info.max is not None else 2**31 - 1
            good, bad = _ints(int(low), int(high)), _hostile_ints(int(low), int(high))
        elif param.type_descriptor.is_path:
            good, bad = _pool(world, "out-folder", "good"), _pool(world, "file", "bad")
        else:
            good = st.one_of(_pool(world, "model", "good"), _pool(world, "text", "good"))
            bad = st.sampled_from(HOSTILE_TEXT)
    return bad if hostile else good


@st.composite
def command_lines(draw, words, command, world):
    """One command line for ``command``: its words, options in any order, arguments.

    Most lines hold values inside every domain (so they run); the others put one or two
    values outside theirs, or leave out something required.
    """
    params = [p for p in command.params if not getattr(p, "hidden", False)]
    # A command with modes (``probe paths --count``) declares which options a mode has no
    # use for (``callback.not_for``); a line in that mode leaves them out.
    not_for = getattr(getattr(command.callback, "__wrapped__", command.callback), "not_for", {})
    modes = [p.name for p in params if p.name in not_for]
    options_mode: list[list[str]] = []
    if modes:
        mode = draw(st.sampled_from(modes))
        params = [p for p in params if p.name not in not_for[mode] and p.name not in modes]
        if draw(st.integers(0, 9)):  # now and then no mode at all
            options_mode = [["--" + mode.replace("_", "-")]]
    # Long runs lean to hostile lines: a refusal costs milliseconds, a run seconds.
    bad_count = draw(st.sampled_from([0, 0, 1, 1, 2, 3] if LONG else [0, 0, 0, 1, 1, 2]))
    bad = set(draw(st.permutations(range(len(params))))[:bad_count])
    options: list[list[str]] = []
    arguments: list[str] = []
    for index, param in enumerate(params):
        hostile = index in bad
        if type(param).__name__ == "TyperArgument":
            if param.nargs == -1:
                count = draw(st.integers(1 if param.required else 0, 3))
                if hostile and draw(st.booleans()):
                    count = 0  # a missing argument
            else:
                count = 1 if param.required or draw(st.integers(0, 3)) else 0
            values = [draw(value_strategy(param, world, False)) for _ in range(count)]
            if hostile and values:
                values[draw(st.integers(0, len(values) - 1))] = draw(
                    value_strategy(param, world, True)
                )
            arguments += values
            continue
        flag = getattr(param, "is_flag", False) and param.type_descriptor.annotation is bool
        if flag:
            choice = draw(st.sampled_from([None, *param.opts, *param.secondary_opts]))
            if choice is not None:
                options.append([choice])
            continue
        numeric = isinstance(domains.domain_of(param), domains.Count | domains.Real)
        # Numbers are always given: a default size is a full-size run (minutes).
        present = param.required or numeric or hostile or draw(st.booleans())
        if param.required and hostile and draw(st.booleans()):
            present = False  # a missing required option
        if present:
            value = draw(value_strategy(param, world, hostile))
            options.append([draw(st.sampled_from(param.opts)), value])
    options += options_mode
    if draw(st.integers(0, 29)) == 0:
        options.append([draw(st.sampled_from(["--bogus", "--tokens=", "-x", "--", "--help"]))])
    order = draw(st.permutations(range(len(options))))
    line = [*words]
    for i in order:
        line += options[i]
    # Arguments after "--" when one starts with "-" (as a user would have to write it).
    if any(a.startswith("-") for a in arguments):
        line.append("--")
    return line + arguments


# --- the contract --------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple]:
    """Every file and folder under ``root``: (kind, size, mtime) of files, kind of folders."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            seen[os.path.relpath(os.path.join(folder, name), root)] = ("dir",)
        for name in files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            seen[os.path.relpath(path, root)] = ("file", info.st_size, info.st_mtime_ns)
    return seen


class Stopped(BaseException):
    """The per-command-line time limit (not an Exception: nothing may catch it)."""


#: Whether the per-line alarm went off: the command's clean exit 130 ("interrupted; ...")
#: is then the time limit, not the command's doing.
alarm = {"fired": False}

#: When a drawn Ctrl-C reaches a command line (seconds after it starts): most lines get
#: none; the others one early (while it checks and loads), mid-run or late (while it
#: writes).  The signal is recorded as probe's handler records a real one.
SIGNAL_TIMES = st.one_of(
    st.none(), st.none(), st.none(), st.sampled_from([0.001, 0.05, 0.3, 1.0, 2.5])
)


def _alarm(signum, frame):
    """The time limit interrupts the command as Ctrl-C would (probe records it and stops at
    its next safe point); a command still running ``GRACE`` seconds later is stopped by
    force, and again every ``GRACE`` seconds (a finaliser may swallow ``Stopped``)."""
    if alarm["fired"]:
        raise Stopped
    alarm["fired"] = True
    interrupts.record(signal.SIGINT)


def unquoted(text: str) -> str:
    """A path as probe prints it (``cli.console.shown``) back to the name: ``$'...'``
    quoting decoded, written here from bash's rules (``\\xHH`` a byte), not by calling
    probe."""
    if not (text.startswith("$'") and text.endswith("'")):
        return text
    names = {"t": b"\t", "n": b"\n", "r": b"\r", "\\": b"\\", "'": b"'"}
    out, rest = b"", text[2:-1]
    pattern = re.compile(r"\\([tnr\\']|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")
    while (found := pattern.search(rest)) is not None:
        out += rest[: found.start()].encode("utf-8", "surrogateescape")
        code = found.group(1)
        if code in names:
            out += names[code]
        elif code[0] == "x":  # \xHH is one byte to bash
            out += bytes([int(code[1:], 16)])
        else:
            out += chr(int(code[1:], 16)).encode("utf-8")
        rest = rest[found.end() :]
    return os.fsdecode(out + rest.encode("utf-8", "surrogateescape"))


def nameable(line: list[str]) -> set[str]:
    """The options a line of ``line`` may name: those of its command (the longest command
    whose words start the line), ``--help``, and the line's own words (an unknown option
    is named as typed)."""
    words, command = max(
        ((w, c) for w, c in COMMANDS if tuple(line[: len(w)]) == w), key=lambda wc: len(wc[0])
    )
    flags = {flag for param in command.params for flag in (*param.opts, *param.secondary_opts)}
    return flags | {"--help"} | {word.partition("=")[0] for word in line}


def check_flags(stderr: str, line: list[str], shown: str) -> None:
    """Every option an error or warning line names is one the command has (or typed)."""
    known = nameable(line)
    for said in stderr.splitlines():
        if said.startswith(("probe: error: ", "probe: warning: ")):
            foreign = [flag for flag in FLAG.findall(said) if flag not in known]
            assert not foreign, f"{said!r} names {foreign}, no option of the command: {shown}"


def check_contract(line: list[str], sandbox: Path, ctrl_c: float | None = None) -> str:
    """Run ``line`` in ``sandbox``; assert the contract; the outcome for the log.

    ``ctrl_c``: seconds after the start at which a Ctrl-C arrives.  The line must then
    stop cleanly at probe's next safe point: exit 130 with one "interrupted" line and no
    file half-written (a result never without its report), or exit 0 or 2 if it was done
    or refused first."""
    before = snapshot(sandbox)
    alarm["fired"] = False
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, TIMEOUT if ctrl_c is None else ctrl_c, GRACE)
    try:
        result = CliRunner().invoke(app, line, catch_exceptions=True)
    except Stopped:
        return "timeout"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        interrupts.clear()  # the limit may have come after the command's last safe point
    if isinstance(result.exception, Stopped):
        return "timeout"
    shown = f"probe {' '.join(map(repr, line))}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    check_flags(result.stderr, line, shown)
    if alarm["fired"] and result.exit_code == 130:
        if ctrl_c is None:
            return "timeout"
        return "interrupted: " + _check_interrupted(result, sandbox, before, shown)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        import traceback

        trace = "".join(traceback.format_exception(result.exception))
        pytest.fail(f"traceback from {shown}\n{trace}")
    assert "Traceback" not in result.output, shown
    after = snapshot(sandbox)
    code = result.exit_code
    assert code in (0, 2), f"exit {code}: {shown}"
    if code == 2:
        lines = [line for line in result.stderr.splitlines() if not PROGRESS.match(line)]
        assert len(lines) == 1 and lines[0].startswith("probe: error: "), shown
        assert result.stderr.splitlines()[-1] == lines[0], shown
        assert result.stdout == "", shown
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if kept := KEPT.search(lines[0]):  # only in the folder named, and the folders to it
            store = os.path.relpath(sandbox / unquoted(kept[1]), sandbox)
            changed = [k for k in changed if not (k == store or k.startswith(store + os.sep)
                       or (store.startswith(k + os.sep) and k not in before))]  # fmt: skip
        assert not changed, f"wrote {changed} and exited 2: {shown}"
        return "refused: " + lines[0].removeprefix("probe: error: ")[:160]
    for line_ in result.stderr.splitlines():
        assert ALLOWED_STDERR.match(line_), f"stray stderr line {line_!r}: {shown}"
    new = sorted(k for k in after if before.get(k) != after[k])
    leftovers = [k for k in after if LEFTOVER.search(Path(k).name)]
    assert not leftovers, f"left {leftovers}: {shown}"
    for name in new:
        if name.endswith(".nc"):
            assert name[:-3] + ".html" in after, f"{name} without its report: {shown}"
    for match in re.finditer(r"^(?:result|report|index|comparison|training report): (.+)$",
                             result.stdout, flags=re.M):  # fmt: skip
        named = Path(unquoted(match.group(1)))
        assert (named if named.is_absolute() else sandbox / named).exists(), shown
    return "ok" if new else "ok, nothing written"


def _check_interrupted(result, sandbox: Path, before: dict, shown: str) -> str:
    """The contract of a line a Ctrl-C stopped: one line, nothing on stdout after it that
    claims a file, no staging left, every result beside its report; what it says it had
    written before the interrupt exists."""
    assert "Traceback" not in result.output, shown
    lines = [line for line in result.stderr.splitlines() if not PROGRESS.match(line)]
    errors = [line for line in lines if line.startswith("probe: error: ")]
    assert len(errors) == 1 and errors[0].startswith("probe: error: interrupted"), shown
    assert lines[-1] == errors[0], shown
    after = snapshot(sandbox)
    leftovers = [k for k in after if LEFTOVER.search(Path(k).name)]
    assert not leftovers, f"left {leftovers}: {shown}"
    new = sorted(k for k in after if before.get(k) != after[k])
    for name in new:
        if name.endswith(".nc"):
            assert name[:-3] + ".html" in after, f"{name} without its report: {shown}"
    if "nothing was written" in errors[0] and "written before" not in errors[0]:
        assert not [k for k in new if after[k][0] == "file"], f"wrote {new}: {shown}"
    return "stopped" if new else "stopped, nothing written"


def _log(words, line, outcome, seconds) -> None:
    if LOG:
        with open(LOG, "a", encoding="utf-8") as log:
            log.write(json.dumps({"command": " ".join(words), "line": line,
                                  "outcome": outcome, "seconds": round(seconds, 2)}) + "\n")  # fmt: skip


@pytest.mark.parametrize(("words", "command"), COMMANDS, ids=[" ".join(w) for w, _ in COMMANDS])
def test_every_command_line_keeps_the_contract(words, command, world, tmp_path, monkeypatch):
    root, pool = world
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "BROWSER"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    counter = iter(range(10**9))
    # A line that left its sandbox exactly as it was copied (every refusal, asserted)
    # leaves it to the next line; otherwise the next line gets a fresh copy.
    kept: list[tuple[Path, dict]] = []
    session_cache = os.environ["PROBE_CACHE_DIR"]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=not LONG,
        database=None if not LONG else settings.default.database,
        suppress_health_check=list(HealthCheck),
    )
    @given(line=command_lines(words, command, pool), ctrl_c=SIGNAL_TIMES, cache=st.booleans())
    def run(line, ctrl_c, cache):
        import shutil

        # Now and then a cache whose theory constants are malformed (tests/cli_world.py), a
        # copy of its own, outside the sandbox (what a run remembers is not what it writes).
        if cache:
            mine = tmp_path / f"cache{next(counter)}"
            shutil.copytree(root / "cache", mine)
            monkeypatch.setenv("PROBE_CACHE_DIR", str(mine))
        else:
            monkeypatch.setenv("PROBE_CACHE_DIR", session_cache)
        if kept:
            sandbox, pristine = kept.pop()
        else:
            sandbox = tmp_path / f"run{next(counter)}"
            sandbox.mkdir()
            copy_world(root, sandbox)
            pristine = snapshot(sandbox)
        monkeypatch.chdir(sandbox)
        start = time.monotonic()
        outcome = "failed"
        try:
            outcome = check_contract(line, sandbox, ctrl_c)
        finally:
            _log(words, line, outcome, time.monotonic() - start)
            monkeypatch.chdir(tmp_path)
            if outcome != "timeout" and snapshot(sandbox) == pristine:
                kept.append((sandbox, pristine))
            else:
                shutil.rmtree(sandbox, ignore_errors=True)

    run()


def test_every_option_has_a_domain():
    """The fuzzer knows an option's values from its domain: a ``cli.domains`` object, or
    typer's own choices (an Enum) or flag.  A bare number, string or path option would say
    nothing of finite, device, memory or a readable file: every other option of probe
    declares a domain."""
    missing = [
        f"{' '.join(words)} {param.opts[0] if param.opts else param.name}"
        for words, command in COMMANDS
        for param in command.params
        if domains.domain_of(param) is None
        and not param.type_descriptor.is_choice
        and not (getattr(param, "is_flag", False) and param.type_descriptor.annotation is bool)
        and not (getattr(param, "is_eager", False) and param.name == "version")
    ]
    assert not missing, missing
