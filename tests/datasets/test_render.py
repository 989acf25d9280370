"""``gym dataset render``: prompt templates applied to raw rows, with clear errors."""

from __future__ import annotations

import pytest

from nemo_gym.cli.main import main
from nemo_gym.datasets.render import PromptRenderError, PromptTemplate
from nemo_gym.errors import ConfigError
from tests.datasets.conftest import read_rows, write_rows
from tests.helpers import write


def render(capsys, *extra: str) -> tuple[int, str, str]:
    code = main(["dataset", "render", "--input", "raw.jsonl", "--prompt-config", "prompt.yaml", *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_render_fills_system_and_user_templates(workdir, capsys):
    write(
        workdir / "prompt.yaml",
        "system: 'Answer in {lang}.'\nuser: |-\n  {meta.topic}: {question} {{braces}} {score:.1f}\n",
    )
    write_rows(
        workdir / "raw.jsonl",
        [{"question": "2+2?", "lang": "French", "meta": {"topic": "math"}, "score": 1,
          "responses_create_params": {"temperature": 0.3}}],
    )  # fmt: skip
    code, out, err = render(capsys, "--output", "rendered.jsonl")
    assert code == 0, err
    [row] = read_rows(workdir / "rendered.jsonl")
    assert row["responses_create_params"] == {
        "temperature": 0.3,
        "input": [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "math: 2+2? {braces} 1.0"},
        ],
    }
    assert row["question"] == "2+2?" and row["prompt_config_used"] == "prompt.yaml"
    assert "Rendered 1 row(s)" in out


def test_missing_field_names_the_line_and_the_available_fields(workdir, capsys):
    write(workdir / "prompt.yaml", "user: '{question}'\n")
    write_rows(workdir / "raw.jsonl", [{"question": "ok"}, {"prompt": "x", "id": 3}])
    code, _, err = render(capsys, "-o", "rendered.jsonl")
    assert code == 1
    assert "raw.jsonl:2: prompt field {question} is missing" in err and "(available: id, prompt)" in err
    assert not (workdir / "rendered.jsonl").exists()  # nothing partial is left behind


def test_rows_with_an_existing_prompt_are_rejected(workdir, capsys):
    write(workdir / "prompt.yaml", "user: '{q}'\n")
    write_rows(workdir / "raw.jsonl", [{"q": "a", "responses_create_params": {"input": "already"}}])
    code, _, err = render(capsys, "-o", "rendered.jsonl")
    assert code == 1 and "raw.jsonl:1: the row already has responses_create_params.input" in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("system: hi\n", "needs a `user` template"),
        ("user: hi\nassistant: no\n", "unknown key(s) assistant"),
        ("user: 'a { b'\n", "literal braces"),
        ("user: 'a {} b'\n", "positional"),
        ("- user\n", "must be a mapping"),
    ],
)
def test_bad_prompt_configs(tmp_path, text, message):
    write(tmp_path / "p.yaml", text)
    with pytest.raises(ConfigError) as info:
        PromptTemplate.load(tmp_path / "p.yaml")
    assert message in str(info.value)


def test_missing_prompt_config_and_missing_flags(workdir, capsys):
    write_rows(workdir / "raw.jsonl", [{"q": "a"}])
    code, _, err = render(capsys, "-o", "out.jsonl")
    assert code == 1 and "prompt config prompt.yaml does not exist" in err
    code = main(["dataset", "render", "--input", "raw.jsonl"])
    err = capsys.readouterr().err
    assert code == 1 and "prompt_config is required" in err and "output_jsonl_fpath is required" in err


def test_nested_lookup_errors_and_json_values():
    template = PromptTemplate(user="{a.b} {items}")
    assert template.apply({"a": {"b": 1}, "items": [1, 2]})["responses_create_params"]["input"][0]["content"] == (
        "1 [1,2]"
    )
    with pytest.raises(PromptRenderError, match=r"no 'b' in a \(available: c\)"):
        template.apply({"a": {"c": 1}, "items": []})
