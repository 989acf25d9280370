"""A session that is not ours is placed on its loop through aiohttp's public (deprecated) ``loop`` property, with its
warning kept from the caller (transport/shared_session.py; issue 36: no private names)."""

from __future__ import annotations

import asyncio
import warnings

import aiohttp

from nemo_gym.transport.shared_session import close_anywhere, usable_here


async def test_a_foreign_session_is_usable_on_its_own_loop_without_a_warning() -> None:
    session = aiohttp.ClientSession()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert usable_here(session)
    finally:
        await session.close()


def test_a_foreign_session_is_closed_from_synchronous_code_on_its_idle_loop() -> None:
    loop = asyncio.new_event_loop()
    try:

        async def make() -> aiohttp.ClientSession:
            return aiohttp.ClientSession()

        session = loop.run_until_complete(make())
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            close_anywhere(session)
        assert session.closed
    finally:
        loop.close()
