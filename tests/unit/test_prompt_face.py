"""nemo_gym.prompt: NeMo Gym's prompt-config API, served by the same templating as ``gym dataset render``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nemo_gym.datasets.render import PromptRenderError, PromptTemplate
from nemo_gym.errors import ConfigError
from nemo_gym.prompt import PromptConfig, apply_prompt_to_row, fill_prompt, load_prompt_config


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    load_prompt_config.cache_clear()
    yield
    load_prompt_config.cache_clear()


def test_load_reads_user_and_system_and_caches_per_path(tmp_path: Path) -> None:
    path = tmp_path / "judge.yaml"
    path.write_text("system: You grade answers.\nuser: |-\n  Question: {question}\n  Answer: {answer}\n")
    config = load_prompt_config(str(path))
    assert config == PromptConfig(system="You grade answers.", user="Question: {question}\nAnswer: {answer}")
    assert load_prompt_config(str(path)) is config
    (tmp_path / "user_only.yaml").write_text("user: '{q}'\n")
    assert load_prompt_config(str(tmp_path / "user_only.yaml")).system is None


def test_a_relative_path_is_found_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "p.yaml").write_text("user: '{q}'\n")
    monkeypatch.chdir(tmp_path)
    assert load_prompt_config("prompts/p.yaml").user == "{q}"


@pytest.mark.parametrize(
    ("text", "message"),
    [("system: only\n", "needs a `user` template"), ("- a\n- b\n", "must be a mapping"), ("user: 'a { b'\n", "brace")],
)
def test_bad_prompt_files_are_config_errors_naming_the_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_prompt_config(str(path))
    assert str(path) in str(info.value)
    with pytest.raises(ConfigError, match="does not exist"):
        load_prompt_config(str(tmp_path / "missing.yaml"))


def test_fill_prompt_builds_system_and_user_messages() -> None:
    config = PromptConfig(system="Grade {subject}.", user="Put the answer in \\boxed{{{answer}}}; score {score:.1f}")
    assert fill_prompt(config, {"subject": "physics", "answer": "42", "score": 1}) == [
        {"role": "system", "content": "Grade physics."},
        {"role": "user", "content": "Put the answer in \\boxed{42}; score 1.0"},
    ]
    assert fill_prompt(PromptConfig(user="{q}"), {"q": "hi"}) == [{"role": "user", "content": "hi"}]


def test_lists_and_mappings_are_inserted_as_python_text_like_nemo_gym() -> None:
    config = PromptConfig(user="{options} {meta}")
    [message] = fill_prompt(config, {"options": ["A", "B"], "meta": {"k": 1}})
    assert message["content"] == "['A', 'B'] {'k': 1}"  # what str.format_map gives
    # the dataset renderer keeps inserting JSON: same code, its own default
    assert PromptTemplate(user="{options}").messages({"options": ["A", "B"]})[0]["content"] == '["A","B"]'


def test_a_missing_field_is_a_key_error_listing_the_rows_fields() -> None:
    with pytest.raises(KeyError) as info:
        fill_prompt(PromptConfig(user="{expected}"), {"question": "q", "answer": "a"})
    assert (
        str(info.value) == "prompt field {expected} is missing: the row has no 'expected' (available: answer, question)"
    )
    assert isinstance(info.value, PromptRenderError)  # and a user error of the one tree


def test_apply_prompt_to_row_sets_the_input_and_keeps_everything_else() -> None:
    config = PromptConfig(user="{question}")
    row: dict[str, Any] = {
        "question": "2+2?",
        "expected_answer": "4",
        "responses_create_params": {"temperature": 0.5, "input": "old"},
    }
    rendered = apply_prompt_to_row(row, config)
    assert rendered == {
        "question": "2+2?",
        "expected_answer": "4",
        "responses_create_params": {"temperature": 0.5, "input": [{"role": "user", "content": "2+2?"}]},
    }
    assert row["responses_create_params"]["input"] == "old"  # the row given is untouched
    assert apply_prompt_to_row({"question": "x", "responses_create_params": "junk"}, config)[
        "responses_create_params"
    ] == {"input": [{"role": "user", "content": "x"}]}
    assert "prompt_config_used" not in rendered
