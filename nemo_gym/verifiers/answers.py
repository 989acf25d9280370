"""Answer extraction shared by verifiers: the assistant's text, and the content of its last ``\\boxed{}``.

Environments grade the *final* answer a model commits to, so these helpers always pick the last occurrence, and they
count braces instead of using a regex so that nested LaTeX such as ``\\boxed{\\frac{1}{2}}`` comes out whole.
"""

from __future__ import annotations

import re

from nemo_gym.openai_responses import NeMoGymResponse, NeMoGymResponseOutputMessage, NeMoGymResponseOutputText

BOX_COMMANDS = ("\\boxed", "\\fbox")
_TEXT_WRAPPER = re.compile(
    r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mathit|operatorname|mbox|boxed)\s*\{([^{}]*)\}"
)


def assistant_text(response: NeMoGymResponse, separator: str = "\n") -> str:
    """The ``output_text`` parts of every assistant message, in order; tool calls and reasoning are left out."""
    return separator.join(
        part.text
        for item in response.output
        if isinstance(item, NeMoGymResponseOutputMessage)
        for part in item.content
        if isinstance(part, NeMoGymResponseOutputText)
    )


def _balanced_group(text: str, open_index: int) -> str | None:
    """The text inside the brace group that opens at ``open_index``, or None when it never closes.

    Escaped braces (``\\{``, ``\\}``) are literal characters in LaTeX, so they do not count.
    """
    depth = 0
    index = open_index
    while index < len(text):
        char = text[index]
        if char == "\\":
            index += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : index]
        index += 1
    return None


def boxed_contents(text: str) -> list[str]:
    """The content of every complete ``\\boxed{...}`` / ``\\fbox{...}`` in ``text``, in order of appearance."""
    return [content for _, content in _boxes(text) if content is not None]


def _boxes(text: str) -> list[tuple[int, str | None]]:
    """Every box command followed by ``{``, in order: (position, content), content None when it never closes."""
    found: list[tuple[int, str | None]] = []
    for command in BOX_COMMANDS:
        start = text.find(command)
        while start != -1:
            index = start + len(command)
            while index < len(text) and text[index] == " ":
                index += 1
            if index < len(text) and text[index] == "{":
                found.append((start, _balanced_group(text, index)))
            start = text.find(command, start + len(command))
    return sorted(found, key=lambda box: box[0])


def last_boxed(text: str, *, final_only: bool = False) -> str | None:
    """The content of the last complete ``\\boxed{}`` (the model's final answer), stripped; None when there is none
    or it is empty.

    ``final_only=True``: the last box the model opened must be the one that closes; a final answer cut off mid-box
    gives None rather than an earlier box the model had moved on from.
    """
    boxes = _boxes(text)
    if final_only:
        boxes = boxes[-1:]
    contents = [content for _, content in boxes if content is not None]
    return (contents[-1].strip() or None) if contents else None


def strip_text_wrappers(text: str) -> str:
    """``\\text{B}`` -> ``B``: unwraps text-style LaTeX commands (repeatedly, for nested ones) and strips spaces."""
    previous = None
    while previous != text:
        previous, text = text, _TEXT_WRAPPER.sub(r"\1", text)
    return text.strip()
