"""The ``gym`` command-line router: ``gym <group> <action> [flags] [+key=value ...]`` to a command's handler.

A flag either sets a field of the command's typed settings or becomes a Hydra override (see :mod:`nemo_gym.cli.flags`);
tokens that are not flags pass through as overrides. Any error the framework raises on purpose
(:class:`~nemo_gym.errors.NeMoGymError`: a user mistake, a server that would not start, a registry or transport
failure) is printed as one red line with exit code 1; ``-v`` adds the traceback.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import traceback
from typing import Any

from pydantic import ValidationError

from nemo_gym.cli.command import Command, Invocation
from nemo_gym.cli.commands import ALL_COMMANDS, GROUP_HELP
from nemo_gym.cli.flags import flag_fields, flags_to_overrides, search_dirs
from nemo_gym.cli.output import print_error, stop_writing_stdout
from nemo_gym.config.roots import searching
from nemo_gym.errors import NeMoGymError

PROG = "gym"


class RouterParser(argparse.ArgumentParser):
    """argparse with did-you-mean hints for mistyped commands and choices."""

    def error(self, message: str) -> None:  # type: ignore[override]
        if "invalid choice:" in message:
            bad = message.split("invalid choice:", 1)[1].split("(", 1)[0].strip().strip("'\"")
            choices = [c.strip(" '\")") for c in message.split("choose from", 1)[-1].split(",")]
            close = difflib.get_close_matches(bad, choices, n=2, cutoff=0.5)
            if close:
                message = f"{message}. Did you mean: {' or '.join(close)}?"
        self.print_usage(sys.stderr)
        print_error(f"{self.prog}: {message}")
        raise SystemExit(2)


def build_parser() -> RouterParser:
    parser = RouterParser(
        prog=PROG,
        description="NeMo Gym: RL environments for LLMs. Run `gym <group> --help` for the commands of a group.",
        epilog="Any token that is not a flag is a Hydra-style override: +key=value, ++key=value, key=value, ~key.",
    )
    parser.add_argument("--version", action="store_true", help="print version information and exit")
    parser.add_argument("--json", action="store_true", help="with --version: print JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging and full tracebacks")
    groups = parser.add_subparsers(dest="group", metavar="<group>", parser_class=RouterParser)
    group_parsers: dict[str, Any] = {}  # each group's sub-parsers (add_subparsers' answer)
    for command in ALL_COMMANDS:
        if command.group is None:
            target = groups.add_parser(
                command.action, help=command.help, description=command.description or command.help
            )
        else:
            if command.group not in group_parsers:
                group_parser = groups.add_parser(command.group, help=GROUP_HELP[command.group])
                group_parsers[command.group] = group_parser.add_subparsers(
                    dest="action", metavar="<action>", parser_class=RouterParser
                )
            target = group_parsers[command.group].add_parser(
                command.action,
                help=command.help,
                description=command.description or command.help,
                epilog="\n".join(command.examples) or None,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        target.set_defaults(command=command)
        target.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")
        for positional in command.positionals:
            target.add_argument(
                positional.name, help=positional.help, nargs=positional.nargs, choices=positional.choices
            )
        for flag in command.flags:
            flag.register(target)
    return parser


def _split_unknown(command: Command, unknown: list[str]) -> list[str]:
    """Unknown ``-x`` tokens are errors (with a hint); so is a bare word (a path, say), which no override can be:
    overrides have an ``=`` or start with ``~``. Anything else is an override passed through."""
    known = [name for flag in command.flags for name in flag.names] + ["--verbose", "--help"]
    words = " ".join(command.words)
    for token in unknown:
        if token.startswith("-"):
            name = token.split("=", 1)[0]
            close = difflib.get_close_matches(name, known, n=2, cutoff=0.5)
            hint = f" Did you mean: {' or '.join(close)}?" if close else ""
            print_error(f"gym {words}: unknown flag {name!r}.{hint} See `gym {words} --help`.")
            raise SystemExit(2)
        if "=" not in token and not token.startswith("~"):
            print_error(f"gym {words}: unexpected argument {token!r}{_value_hint(command, token)}")
            raise SystemExit(2)
    return unknown


def _value_hint(command: Command, token: str) -> str:
    """How ``token`` could be given instead: a path after the first flag that takes one, else see the help."""
    words = " ".join(command.words)
    paths = [flag.names[0] for flag in command.flags if flag.metavar == "PATH"]
    if paths and ("/" in token or "." in token):
        return f": a path goes after its flag, e.g. gym {words} {paths[0]} {token}. See `gym {words} --help`."
    return f": this command takes flags and key=value overrides. See `gym {words} --help`."


def run(argv: list[str]) -> int:
    """Run the command ``argv`` names; what it raises on purpose becomes one error line and an exit code."""
    verbose = "-v" in argv or "--verbose" in argv
    try:
        return _dispatch(argv)
    except NeMoGymError as e:
        if verbose:
            traceback.print_exc()
        print_error(str(e))
        return 1
    except ValidationError as e:
        if verbose:
            traceback.print_exc()
        print_error(_format_validation_error(e))
        return 1
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    except BrokenPipeError:
        return stop_writing_stdout()


def _dispatch(argv: list[str]) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.version:
        from nemo_gym.cli.commands.info import print_version

        print_version(as_json=args.json)
        return 0
    command: Command | None = getattr(args, "command", None)
    if command is None:
        if args.group and args.group != "search":
            parser.parse_args([args.group, "--help"])
        parser.print_help()
        return 0 if not argv else 2
    passthrough = _split_unknown(command, unknown)
    with searching(search_dirs(args)):
        overrides = flags_to_overrides(args, command.flags, passthrough)
        fields = flag_fields(args, command.flags, passthrough)
        result = command.handler(Invocation(args, overrides, fields))
    return int(result or 0)


def _format_validation_error(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or error.title
        if item["type"] == "missing":
            parts.append(f"{field} is required (pass its flag or +{field}=<value>)")
        else:
            parts.append(f"{field}: {item['msg']}")
    return f"invalid {error.title} config: " + "; ".join(parts)
