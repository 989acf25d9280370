"""Paths written relative to a NeMo Gym checkout (``resources_servers/x/prompts/judge.yaml``) are found from inside
that checkout's server folders, where a server process and its tests run, as NeMo Gym finds them relative to its
own checkout root."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym import INSTALL_DIR
from nemo_gym.config.roots import enclosing_checkout, search_roots, searching
from nemo_gym.errors import ConfigPathNotFoundError
from nemo_gym.prompt import load_prompt_config

PROMPT = "resources_servers/judge_env/prompts/judge.yaml"


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    load_prompt_config.cache_clear()
    yield
    load_prompt_config.cache_clear()


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "Gym"
    (root / "resources_servers" / "judge_env" / "tests").mkdir(parents=True)
    (root / "resources_servers" / "judge_env" / "prompts").mkdir()
    (root / PROMPT).write_text("user: 'Grade {answer}'\n")
    return root


@pytest.mark.parametrize("inside", ["resources_servers/judge_env", "resources_servers/judge_env/tests"])
def test_a_checkout_relative_prompt_is_found_from_inside_a_server_folder(
    checkout: Path, monkeypatch: pytest.MonkeyPatch, inside: str
) -> None:
    monkeypatch.chdir(checkout / inside)
    assert load_prompt_config(PROMPT).user == "Grade {answer}"


def test_the_checkout_comes_after_cwd_and_before_the_install_root(checkout: Path, monkeypatch: pytest.MonkeyPatch):
    folder = checkout / "resources_servers" / "judge_env"
    monkeypatch.chdir(folder)
    roots = search_roots()
    assert roots[:2] == [folder.resolve(), checkout.resolve()] and roots[-1] == INSTALL_DIR
    assert enclosing_checkout(checkout / "responses_api_agents") == checkout
    assert enclosing_checkout(checkout) is None


def test_outside_a_checkout_the_path_needs_a_search_dir(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert search_roots() == [elsewhere.resolve(), INSTALL_DIR]
    with pytest.raises(ConfigPathNotFoundError, match="judge.yaml"):
        load_prompt_config(PROMPT)
    load_prompt_config.cache_clear()
    with searching([checkout]):  # gym ... --search-dir ~/Gym
        assert load_prompt_config(PROMPT).user == "Grade {answer}"


def _parent_dir_seen_from(directory: Path) -> Path:
    code = "import nemo_gym; print(nemo_gym.PARENT_DIR)"
    return Path(subprocess.check_output([sys.executable, "-c", code], cwd=directory, text=True).strip())


def test_parent_dir_is_the_checkout_that_holds_the_working_directory(checkout: Path, tmp_path: Path) -> None:
    """NeMo Gym's code reads ``PARENT_DIR / "responses_api_agents/..."`` as its own checkout; here that is the
    checkout a server folder (or its tests) runs in, or the checkout root itself, else our install root."""
    assert _parent_dir_seen_from(checkout / "resources_servers" / "judge_env" / "tests") == checkout.resolve()
    assert _parent_dir_seen_from(checkout) == checkout.resolve()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _parent_dir_seen_from(elsewhere) == INSTALL_DIR


def test_nemo_gym_07s_read_path_resolver_searches_the_same_roots(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nemo_gym import _resolve_under_cwd_or_install as resolve

    monkeypatch.chdir(checkout / "resources_servers" / "judge_env")
    assert resolve(PROMPT) == checkout.resolve() / PROMPT  # found in the checkout, from inside its server folder
    assert resolve("README.md") == INSTALL_DIR / "README.md"  # the install root comes last
    # a validator that accepts no candidate: the path under the first root, where the user would put it
    assert resolve(PROMPT, validator=lambda p: False) == Path.cwd().resolve() / PROMPT
    assert resolve(tmp_path / "absolute.txt") == tmp_path / "absolute.txt"
