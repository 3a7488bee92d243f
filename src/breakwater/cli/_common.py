"""What every command shares: the exit codes, loading the config, the output console, one-line failures.

A failure a person can cause (a broken config, a busy port, Ctrl-C, a call that failed) is one line
on stderr that says what happened and what to do, and an exit code from `EXIT_CODES`, never a
traceback.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import math
import os
import re
import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

from breakwater.config import Config, find_config, load_config
from breakwater.config._expand import OFF_FOR_VALUES
from breakwater.config._files import load_config_for_server, load_config_serving
from breakwater.config._knobs import plain_number, unknown_variables
from breakwater.errors import ConfigError

__all__ = [
    "EXIT_CODES",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_HANGUP",
    "EXIT_INTERRUPTED",
    "EXIT_LISTEN",
    "EXIT_NOT_READY",
    "EXIT_OK",
    "EXIT_PIPE",
    "Parser",
    "add_config_flag",
    "answer_console",
    "counted",
    "did_you_mean",
    "exit_codes_epilog",
    "fail",
    "load_for_server_or_exit",
    "load_or_exit",
    "out_console",
    "seconds",
    "show",
]

EXIT_OK = 0
EXIT_NOT_READY = 1
EXIT_FAILED = 1  # the same code: "ran, but the answer is not the good one"
EXIT_CONFIG = 2
EXIT_LISTEN = 3
EXIT_HANGUP = 129  # 128 + SIGHUP; a SIGQUIT, handled alike, gives 131 (`cli._run`)
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
EXIT_PIPE = 141  # 128 + SIGPIPE: the reader of our output went away (`| head`)


def seconds(text: str) -> float:
    """An argparse type: a number of seconds, 0 or more (`inf` waits for ever). "nan" reached the clock as a deadline
    and ended in a traceback; argparse reports this error as `--flag: invalid seconds value` with exit code 2."""
    try:
        if not plain_number(text):  # "1_0" and "５" read as 10 and 5
            raise ValueError(text)
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, 0 or more, got {text!r}")
    return value


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high` (or up). A port of 99999 reached `bind` and ended in a
    traceback; a log limit of -1 was taken as a Python slice and dropped the last record without a word."""

    def parse(text: str) -> int:
        try:
            if not plain_number(text):
                raise ValueError(text)
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"{low} or more"
            raise argparse.ArgumentTypeError(f"expected a whole number {bounds}, got {text!r}")
        return value

    return parse


EXIT_CODES: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "ok (status: every enabled server ready; call: the tool answered)"),
    (
        EXIT_FAILED,
        "not every server ready, the call failed (its code is printed), the journal/gateway could not be read, "
        "or the output could not be written (a full disk)",
    ),
    (EXIT_CONFIG, "config or usage error (the message names the file, key or flag, and the fix)"),
    (EXIT_LISTEN, "serve --http cannot listen: the port is in use or the address is not this machine's"),
    (EXIT_HANGUP, "hung up (SIGHUP: the terminal closed), after the clean shutdown of SIGTERM; SIGQUIT gives 131"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
    (EXIT_PIPE, "the output pipe closed early (e.g. `| head`), or stdout was closed (`>&-`) and there was output"),
)

# Piped or redirected output is for reading in full (or by a program): never cut to 80 columns.
PIPED_WIDTH = 10_000


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (what is wrong, where the help is) and exit code 2.

    The exit-code table closes every command's `--help`.
    """

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", exit_codes_epilog(kwargs.get("prog")))
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        """Print `PROG: MESSAGE (see PROG --help)` and exit 2, instead of argparse's usage block; a mistyped choice (a
        subcommand's `config chek`) gets the nearest one, as a mistyped command does."""
        typo = _INVALID_CHOICE.search(message)
        if typo is not None:
            message += did_you_mean(typo.group(1), re.findall(r"'([^']*)'", typo.group(2)))
        self.exit(EXIT_CONFIG, f"{self.prog}: {message} (see {self.prog} --help)\n")


#: argparse's words for a value that is none of an argument's choices (`invalid choice: 'chek' (choose from ...)`).
_INVALID_CHOICE = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


_MEANINGS = dict(EXIT_CODES)
#: Each command's own exit codes, by its `prog`, with what 0 and 1 mean for it; any other prog gets the whole table
#: (`breakwater --help`). Why: `gateway list --help` listed status' and call's meanings, serve's 3 and 141.
_OWN_CODES: dict[str, tuple[tuple[int, str], ...]] = {
    "breakwater serve": (
        (EXIT_OK, "ok: the session ended (its client closed its input, or SIGTERM drained it)"),
        (EXIT_FAILED, "the session could not start (the message says why)"),
        (EXIT_CONFIG, _MEANINGS[EXIT_CONFIG]),
        (EXIT_LISTEN, _MEANINGS[EXIT_LISTEN]),
        (EXIT_HANGUP, _MEANINGS[EXIT_HANGUP]),
        (EXIT_INTERRUPTED, _MEANINGS[EXIT_INTERRUPTED]),
        (EXIT_PIPE, "the client stopped reading the session's output"),
    ),
    "breakwater status": ((EXIT_OK, "every enabled server ready"), (EXIT_NOT_READY, "not every server ready")),
    "breakwater call": ((EXIT_OK, "the tool answered"), (EXIT_FAILED, "the call failed (its code is printed)")),
    "breakwater gateway": ((EXIT_OK, "ok"), (EXIT_FAILED, "the shared gateways could not be read or stopped")),
    "breakwater gateway list": ((EXIT_OK, "ok"), (EXIT_FAILED, "the shared gateways could not be read")),
    "breakwater gateway stop": ((EXIT_OK, "stopped, or none to stop"), (EXIT_FAILED, "a gateway could not be stopped")),
}
#: What every command but `serve` may also exit with: a usage error, Ctrl-C, a closed output pipe.
_COMMON_TAIL = tuple(entry for entry in EXIT_CODES if entry[0] in (EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_PIPE))


def exit_codes_epilog(prog: str | None = None) -> str:
    """The exit-code table for the end of `prog`'s `--help`: its own codes, or all of them (argparse keeps its line
    breaks with RawDescriptionHelpFormatter)."""
    own = _OWN_CODES.get(prog or "")
    if own is None:
        codes = EXIT_CODES
    elif prog == "breakwater serve":
        codes = own
    else:
        codes = own + _COMMON_TAIL
    return "exit codes:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in codes)


def fail(message: str, code: int) -> int:
    """Print `breakwater: MESSAGE` on stderr and return `code` (the one-line failure every command uses)."""
    print(f"breakwater: {message}", file=sys.stderr, flush=True)
    return code


def load_or_exit(path: str | None, *, every_variable: bool = False) -> Config:
    """Load the named config (or find one); on error print it and exit with code 2.

    A server whose entry names a variable that is not set is off, with a warning (`load_config_serving`), unless
    `every_variable` (`config check`: the file must be ready to run whole, and exits 2 naming the variable).
    """
    try:
        where = path if path is not None else find_config()
        config = load_config(where) if every_variable else load_config_serving(where)
    except ConfigError as exc:
        print(f"breakwater: config error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    for spec in config.servers:
        if not spec.enabled and (spec.disabled_by or "").startswith(OFF_FOR_VALUES):
            print(f"breakwater: warning: server {spec.name!r} is off: {spec.disabled_by}", file=sys.stderr)
    for said in unknown_variables():
        print(f"breakwater: warning: {said}", file=sys.stderr)
    return config


def load_for_server_or_exit(path: str | None, name: str) -> Config:
    """`load_or_exit` for a command about server `name` alone: another server's broken entry is a warning (file, key,
    fix) and is left out, so it does not stand in the way; the file and `name`'s own entry must be valid."""
    try:
        config, broken = load_config_for_server(path if path is not None else find_config(), name)
    except ConfigError as exc:
        print(f"breakwater: config error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    for error in broken:
        print(f"breakwater: warning: left out a broken entry (`serve` refuses it): {error}", file=sys.stderr)
    return config


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    """The `--config PATH` flag every command that reads the config takes."""
    parser.add_argument(
        "--config",
        metavar="PATH",
        help="breakwater.toml or an mcpServers JSON file (default: ./breakwater.toml, ./.mcp.json)",
    )


def out_console() -> Console:
    """The console for a command's answer: a terminal's width on a terminal, complete lines anywhere else.

    Rich sizes output that is not a terminal to 80 columns, so `breakwater stats | cat` cut every
    cell of a wide table to "…". Piped output gets a width nothing reaches (tables are only as wide
    as their content) and, as always off a terminal, no colour codes. An explicit `COLUMNS` still
    wins (the demo sizes the tables it relays to its own terminal that way).
    """
    console = answer_console()
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console.width = PIPED_WIDTH
    return console


def answer_console(**options: Any) -> Console:
    """A Rich console on stdout whose reader going away is a `BrokenPipeError`, as for every other write: the exit
    code says so (EXIT_PIPE, `cli._run`). Rich's own answer to it is `SystemExit(1)`, a failure in the exit code."""
    from rich.console import Console  # here: an attaching `serve` shows no table and starts without rich

    class _AnswerConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")

    return _AnswerConsole(**options)


def show(renderable: RenderableType) -> None:
    """Print a table (or any view) as a command's answer, through `out_console`.

    Off a terminal each line also loses the spaces rich pads it with to the table's width, so a
    piped title or caption does not turn into a screenful of blanks in a narrower window.
    """
    console = out_console()
    if console.is_terminal:
        console.print(renderable)
        return
    with console.capture() as captured:
        console.print(renderable)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`" (did you mean 'x'?)"` (or `'x' or 'y'`) for the closest of `choices`, or "" when none is close.

    Two suggestions, because one typo is often as near to two names (`stauts`: `stats`, `status`).
    """
    close = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""


def counted(n: object, noun: str) -> str:
    """`1 session`, `2 sessions` (a plain `s` plural: every noun counted here takes one)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
