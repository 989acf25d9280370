"""code_gen's reward rule: extraction, comparison, result codes, reward modes, metrics and the example data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.config_types import AggregateMetricsRequest
from resources_servers.code_gen.app import CodeGenVerifyRequest
from resources_servers.code_gen.grading import extract_code, outputs_match
from resources_servers.code_gen.tests.helpers import make_server, python_reply, reply, request

pytestmark = pytest.mark.timeout(120)

SUM = "n = int(input())\nprint(sum(map(int, input().split())))"
SUM_TESTS = (["2\n1 2\n", "3\n5 5 5\n", "1\n-4\n"], ["3\n", "15\n", "-4\n"])


async def test_a_correct_solution_passes_every_test():
    result = await make_server().verify(request(python_reply(SUM), *SUM_TESTS))
    assert (result.reward, result.result, result.num_passed, result.num_tests) == (1.0, "passed", 3, 3)
    assert result.extracted_model_code.startswith("n = int(input())")
    assert [t["status"] for t in result.tests] == ["passed"] * 3 and result.failure is None


async def test_a_wrong_answer_stops_at_the_first_failure_and_says_where():
    wrong = "n = int(input())\nprint(sum(map(int, input().split())) + (n == 3))"
    result = await make_server().verify(request(python_reply(wrong), *SUM_TESTS))
    assert (result.reward, result.result) == (0.0, "wrong_answer")
    assert [t["status"] for t in result.tests] == ["passed", "wrong_answer"]
    assert result.failure["test_index"] == 1
    assert (result.failure["expected_output"], result.failure["actual_output"]) == ("15\n", "16\n")


async def test_fraction_mode_runs_every_test_and_scores_the_share_passed():
    wrong_once = "n = int(input())\nprint(sum(map(int, input().split())) + (n == 3))"
    result = await make_server(reward_mode="fraction").verify(request(python_reply(wrong_once), *SUM_TESTS))
    assert result.reward == pytest.approx(2 / 3)
    assert [t["status"] for t in result.tests] == ["passed", "wrong_answer", "passed"]
    assert result.result == "wrong_answer"


@pytest.mark.parametrize(
    ("text", "result"),
    [
        ("", "no_code"),
        ("The answer is to sum the numbers.", "no_code"),
        ("```cpp\nint main() { return 0; }\n```", "no_code"),
        ("```python\n   \n```", "no_code"),
        ("```python\nprint('unterminated block'", "no_code"),
        ("```python\ndef broken(:\n    pass\n```", "syntax_error"),
        ("```python\nraise ValueError('bad input')\n```", "runtime_error"),
        ("```python\nimport sys\nsys.exit(2)\n```", "runtime_error"),
    ],
)
async def test_malformed_and_failing_code_gets_zero_with_its_result_code(text, result):
    verified = await make_server().verify(request(reply(text), *SUM_TESTS))
    assert (verified.reward, verified.result) == (0.0, result)


async def test_a_runtime_error_reports_the_traceback():
    verified = await make_server().verify(request(python_reply("raise ValueError('bad input')"), *SUM_TESTS))
    assert "ValueError: bad input" in verified.failure["stderr"]


async def test_the_last_python_block_is_the_solution():
    text = f"Draft:\n```python\nprint('draft')\n```\nFinal:\n```python\n{SUM}\n```\nExample run:\n```text\n3\n```"
    assert extract_code(text).startswith("n = int(input())")
    assert (await make_server().verify(request(reply(text), *SUM_TESTS))).reward == 1.0


def test_output_comparison_is_lenient_on_whitespace_and_number_spelling_only():
    assert outputs_match("3 \n 4\n\n", "3\n4")
    assert outputs_match("1.50 2\n", "1.5 2.0\n")
    assert not outputs_match("3\n4\n", "3\n4\n5\n")
    assert not outputs_match("34\n", "3 4\n")
    assert not outputs_match("nan\n", "nan2\n")
    assert not outputs_match("NaN\n", "NaN \n0") and outputs_match("NaN\n", "NaN")
    assert not outputs_match("yes\n", "YES\n")


async def test_call_based_tests_call_the_function_or_a_solution_method():
    tests = (["[[3, 1, 2]]", "[[]]"], ["[1, 2, 3]", "[]"])
    function = "def sort_list(values):\n    return sorted(values)"
    method = "class Solution:\n    def sort_list(self, values):\n        return sorted(values)"
    for code in (function, method):
        result = await make_server().verify(request(python_reply(code), *tests, fn_name="sort_list"))
        assert (result.reward, result.result) == (1.0, "passed")
    missing = await make_server().verify(
        request(python_reply("def other(v):\n    return v"), *tests, fn_name="sort_list")
    )
    assert missing.result == "runtime_error"


async def test_limits_give_their_own_result_codes():
    server = make_server(memory_limit_mb=256, output_limit_kb=64)
    memory = await server.verify(request(python_reply("x = bytearray(2 * 10**9)\nprint(len(x))"), ["\n"], ["0\n"]))
    output = await server.verify(request(python_reply("while True:\n    print('x' * 1000)"), ["\n"], ["x\n"]))
    assert (memory.result, output.result) == ("memory_limit", "output_limit")
    assert memory.reward == output.reward == 0.0


async def test_unusable_tests_are_reported_not_run():
    result = await make_server().verify(request(python_reply(SUM), ["1\n"], ["1\n", "2\n"]))
    assert (result.reward, result.result) == (0.0, "invalid_tests")


async def test_aggregate_metrics_count_result_codes_and_difficulty():
    rows = [
        {"_ng_task_index": 0, "reward": 1.0, "result": "passed", "difficulty": "easy", "extracted_model_code": "a"},
        {"_ng_task_index": 0, "reward": 0.0, "result": "timeout", "difficulty": "easy", "extracted_model_code": "b"},
    ]
    metrics = await make_server().aggregate_metrics(AggregateMetricsRequest(verify_responses=rows))
    assert metrics.agent_metrics["result/timeout/share"] == 0.5
    assert metrics.agent_metrics["difficulty/easy/mean_reward"] == 0.5
    assert metrics.key_metrics["mean/reward"] == 0.5


REFERENCE_SOLUTIONS = {
    "shelf_totals": "input()\na = list(map(int, input().split()))\nprint(sum(a))\nprint(max(a))",
    "mirror_words": "print(' '.join(w[::-1] for w in reversed(input().split())))",
    "stair_climbing": (
        "n = int(input())\nw = [1, 1, 2]\nfor i in range(3, n + 1):\n    w.append((w[-1] + w[-2] + w[-3]) % 1000000007)\n"
        "print(w[n])"
    ),
    "average_temperature": "n = int(input())\nt = list(map(int, input().split()))\nprint(f'{sum(t) / n:.2f}')",
    "longest_run": (
        "def longest_run(s):\n    best = run = 0\n    for i, c in enumerate(s):\n"
        "        run = run + 1 if i and s[i - 1] == c else 1\n        best = max(best, run)\n    return best"
    ),
}


async def test_every_example_row_is_solvable():
    rows = [
        json.loads(line) for line in (Path(__file__).parents[1] / "data" / "example.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 5
    server = make_server(unit_test_timeout_secs=5)
    for row in rows:
        body = CodeGenVerifyRequest.model_validate(row | {"response": python_reply(REFERENCE_SOLUTIONS[row["id"]])})
        result = await server.verify(body)
        assert (row["id"], result.result) == (row["id"], "passed"), result.failure
