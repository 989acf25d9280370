"""The ``gym`` (alias ``ng``) console command: ``gym <group> <action> [flags] [+key=value ...]``.

Only the standard library is imported before :func:`main` runs, so a collect command against running servers can
fork its row checker (``rollouts/forked_check.py``) before the ~0.15 s of importing the router and its commands, and
the child's own imports run beside them. Everything else is in :mod:`nemo_gym.cli.router`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

OPTIONS_BEFORE_GROUP = frozenset({"-v", "--verbose"})
INPUT_FLAGS = ("--input", "-i")
INPUT_OVERRIDES = ("+input_jsonl_fpath=", "++input_jsonl_fpath=", "input_jsonl_fpath=")
PARAMS_OVERRIDES = ("--temperature", "--top-p", "--max-output-tokens", "responses_create_params")
"""Tokens that set create params over every row's: rows checked ahead without them would be checked again."""


def collects_from_running_servers(argv: Sequence[str]) -> bool:
    """Whether ``argv`` reads as ``gym eval run --no-serve …`` (without ``--help``): a run whose rows are checked
    while its servers are already up. A wrong guess only costs a forked child that is never handed a run."""
    words = [token for token in argv if token not in OPTIONS_BEFORE_GROUP]
    return (
        words[:2] == ["eval", "run"] and "--no-serve" in words and not any(token in ("-h", "--help") for token in words)
    )


def input_named_by(argv: Sequence[str]) -> str | None:
    """The input file ``argv`` names (``--input``/``-i`` or the ``input_jsonl_fpath`` override), the last one winning
    as it does when the command parses it; None when it names none, or overrides create params. Only a hint for
    checking rows ahead: the run uses what was checked only for the file it resolved (``CheckedParams.problems_for``)."""
    named = None
    for index, token in enumerate(argv):
        if token.lstrip("+").startswith(PARAMS_OVERRIDES):
            return None
        if token in INPUT_FLAGS and index + 1 < len(argv):
            named = argv[index + 1]
        elif token.startswith("--input="):
            named = token.removeprefix("--input=")
        else:
            for prefix in INPUT_OVERRIDES:
                if token.startswith(prefix):
                    named = token.removeprefix(prefix)
                    break
    return named or None


def main(argv: Sequence[str] | None = None) -> int:
    tokens = list(sys.argv[1:] if argv is None else argv)
    from nemo_gym.rollouts.forked_check import forked_early

    with forked_early(collects_from_running_servers(tokens), input_named_by(tokens)):
        from nemo_gym.cli.router import run

        return run(tokens)


if __name__ == "__main__":
    raise SystemExit(main())
