"""Small helpers for sandbox configs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["rewrite_image"]


def rewrite_image(image: str | None, rewrites: Sequence[Mapping[str, str]]) -> str | None:
    """Point an image at a mirror: the first rule whose ``from`` prefixes ``image`` swaps that prefix for its ``to``.

    Datasets name public images (``docker.io/...``); a cluster often pulls from its own registry, so the config keeps
    an ordered list of ``{"from": prefix, "to": prefix}`` rules. No matching rule, or no image, returns it unchanged.
    """
    if image is None:
        return None
    for rule in rewrites:
        prefix = rule["from"]
        if image.startswith(prefix):
            return rule["to"] + image[len(prefix) :]
    return image
