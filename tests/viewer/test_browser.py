"""Acceptance 1 of issue 14: a real headless Chromium through the viewer's pages (screenshots of each page)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.viewer import rows

pytestmark = [pytest.mark.browser, pytest.mark.e2e, pytest.mark.timeout(240)]

WAIT_S = 60  # hang guard for live updates; the page polls every second

HOSTILE = '<script>document.title="pwned";window.__pwned=1</script><img src=x onerror="window.__pwned=2">'


def _by():
    from selenium.webdriver.common.by import By

    return By


def _wait(driver, condition) -> None:
    """Until ``condition`` holds. An element the page replaced between finding it and reading it (a list re-rendered
    by a search) is asked for again at the next poll, as a missing one is."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S, poll_frequency=0.2, ignored_exceptions=(StaleElementReferenceException,)).until(
        condition
    )


def test_overview_filter_to_reward_zero_and_open_a_trajectory(tmp_path: Path, start_viewer, browser, shots) -> None:
    By = _by()
    path = rows.run_files(tmp_path, "weather", {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0}, failures=1)
    viewer = start_viewer(path)
    browser.get(viewer.url + "/")
    assert browser.find_element(By.ID, "num-rollouts").text == "4"
    assert browser.find_element(By.ID, "mean-reward").text == "0.5000"
    assert "pass@1" in browser.find_element(By.CSS_SELECTOR, "table.metrics").text
    assert len(browser.find_elements(By.CSS_SELECTOR, ".plot svg")) == 4
    assert "timeout: 1" in browser.page_source
    shots(browser, "1-overview")

    browser.find_element(By.ID, "reward-zero").click()
    _wait(browser, lambda d: "rollouts" in d.title)
    table = browser.find_element(By.ID, "rows")
    assert browser.find_element(By.ID, "total").text == "2"
    rewards = [cell.text for cell in table.find_elements(By.CSS_SELECTOR, "tr td:nth-child(2)")]
    assert rewards == ["0", "0"]
    shots(browser, "2-list-reward-0")

    table.find_element(By.CSS_SELECTOR, "a.open").click()
    _wait(browser, lambda d: d.find_elements(By.ID, "tool-calls"))
    assert browser.find_element(By.ID, "reward").text == "0"
    assert browser.find_element(By.ID, "tool-calls").text == "2"
    calls = browser.find_elements(By.CSS_SELECTOR, ".item.function_call")
    assert len(calls) == 2 and "get_weather" in calls[0].text.lower() and '"city": "City1"' in calls[0].text
    assert browser.find_elements(By.CSS_SELECTOR, ".item.function_call_output")
    assert "I don't know." in browser.find_element(By.CSS_SELECTOR, ".item.message").text
    assert "extracted_city" in browser.find_element(By.CSS_SELECTOR, "table.fields").text
    browser.find_element(By.ID, "raw-toggle").click()
    _wait(browser, lambda d: '"_ng_task_index": 1' in d.find_element(By.ID, "raw").text)
    shots(browser, "3-trajectory")


def test_sort_and_text_search(tmp_path: Path, start_viewer, browser, shots) -> None:
    By = _by()
    path = rows.run_files(tmp_path, "weather", {0: 0.0, 1: 1.0, 2: 0.5})
    rows.write(path, [rows.rollout(3, 0, 0.0, "a needle in the haystack")], "a")
    viewer = start_viewer(path)
    browser.get(viewer.url + "/run/0/rollouts?sort=reward&desc=1")
    rewards = [c.text for c in browser.find_elements(By.CSS_SELECTOR, "#rows tr td:nth-child(2)")]
    assert rewards == ["1", "0.5", "0", "0"]
    search = browser.find_element(By.NAME, "q")
    search.send_keys("NEEDLE")
    browser.find_element(By.ID, "apply").click()
    _wait(browser, lambda d: d.find_element(By.ID, "total").text == "1")
    shots(browser, "list-search")


def test_compare_two_runs_shows_the_flipped_tasks(tmp_path: Path, start_viewer, browser, shots) -> None:
    By = _by()
    before = rows.run_files(tmp_path / "a", "before", {0: 1.0, 1: 0.0, 2: 1.0, 3: 0.0})
    after = rows.run_files(tmp_path / "b", "after", {0: 0.0, 1: 1.0, 2: 1.0, 3: 0.0})
    viewer = start_viewer(before, after)
    browser.get(viewer.url + "/")
    shots(browser, "1-runs")
    browser.find_element(By.CSS_SELECTOR, "form.filters button").click()
    _wait(browser, lambda d: d.find_elements(By.ID, "flipped-count"))
    assert browser.find_element(By.ID, "flipped-count").text == "2"
    assert not browser.find_elements(By.ID, "differing-inputs")  # the same inputs: no warning
    assert browser.find_element(By.CSS_SELECTOR, "a.button.broken").text == "task 0: broken"
    assert browser.find_element(By.CSS_SELECTOR, "a.button.fixed").text == "task 1: fixed"
    flips = [
        row.find_element(By.CSS_SELECTOR, "td:nth-child(5)").text
        for row in browser.find_elements(By.CSS_SELECTOR, "#deltas tbody tr")
    ]
    assert flips == ["broken", "fixed", "same", "same"]
    browser.find_element(By.CSS_SELECTOR, "#deltas th:nth-child(1)").click()  # client-side sort: task, descending
    tasks = [
        row.find_element(By.CSS_SELECTOR, "td").text
        for row in browser.find_elements(By.CSS_SELECTOR, "#deltas tbody tr")
    ]
    assert tasks == ["3", "2", "1", "0"]
    # the statistics are gym eval compare's: the page shows the numbers of its report on the same two files
    from nemo_gym.cli.main import main

    args = ["--candidates", str(after), "-o", str(tmp_path / "report"), "--report-format", "json"]
    assert main(["eval", "compare", "--baseline", str(before), *args]) == 0
    [report] = json.loads((tmp_path / "report" / "compare_report.json").read_text())["comparisons"]
    shown = {
        name: browser.find_element(By.ID, name).text
        for name in (
            "baseline-mean",
            "candidate-mean",
            "mean-difference",
            "ci-low",
            "ci-high",
            "fail-to-pass",
            "pass-to-fail",
        )
    }
    assert shown == {
        "baseline-mean": f"{report['baseline_mean']:.4f}", "candidate-mean": f"{report['candidate_mean']:.4f}",
        "mean-difference": f"{report['mean_difference']:+.4f}", "ci-low": f"{report['ci_low']:+.4f}",
        "ci-high": f"{report['ci_high']:+.4f}", "fail-to-pass": str(len(report["fail_to_pass"])),
        "pass-to-fail": str(len(report["pass_to_fail"])),
    }  # fmt: skip
    assert (shown["mean-difference"], shown["fail-to-pass"], shown["pass-to-fail"]) == ("+0.0000", "1", "1")
    shots(browser, "2-compare")

    browser.find_element(By.CSS_SELECTOR, "a.button.fixed").click()
    _wait(browser, lambda d: len(d.find_elements(By.CSS_SELECTOR, "section.side")) == 2)
    before_side, after_side = browser.find_elements(By.CSS_SELECTOR, "section.side")
    assert "I don't know." in before_side.text and "It is cold." in after_side.text
    shots(browser, "3-side-by-side")


def test_a_live_file_gaining_rows_updates_the_open_page(tmp_path: Path, start_viewer, browser, shots) -> None:
    By = _by()
    path = rows.write(tmp_path / "live.jsonl", [rows.rollout(0, 0, 1.0, "It is cold.")])
    viewer = start_viewer(path)
    browser.get(viewer.url + "/run/0")
    assert browser.find_element(By.ID, "num-rollouts").text == "1"
    shots(browser, "1-before")
    with path.open("a") as f:  # a writer mid-line: the half row must wait for its newline
        f.write(rows.json.dumps(rows.rollout(1, 0, 0.0, "no")) + "\n" + '{"reward": 1')
        f.flush()
        _wait(browser, lambda d: d.find_element(By.ID, "num-rollouts").text == "2")
        f.write(', "_ng_task_index": 2}\n')
    _wait(browser, lambda d: d.find_element(By.ID, "num-rollouts").text == "3")
    rows.write(path, [rows.rollout(k, 0, 0.0, "no") for k in range(3, 6)], "a")
    _wait(browser, lambda d: d.find_element(By.ID, "num-rollouts").text == "6")
    assert browser.find_element(By.ID, "mean-reward").text == "0.3333"
    shots(browser, "2-after")


def test_a_hostile_rollout_is_shown_as_text_and_runs_nothing(tmp_path: Path, start_viewer, browser, shots) -> None:
    By = _by()
    row = rows.rollout(0, 0, 0.0, HOSTILE)
    row["agent_ref"] = {"name": '<img src=x onerror="window.__pwned=3">'}
    row["verifier_note"] = HOSTILE
    path = rows.write(tmp_path / "hostile.jsonl", [row])
    viewer = start_viewer(path)
    for page in ("/run/0", "/run/0/rollouts?q=onerror", "/run/0/r/0"):
        browser.get(viewer.url + page)
        assert browser.execute_script("return window.__pwned") is None, page
        assert browser.title != "pwned"
        assert not browser.find_elements(By.CSS_SELECTOR, "main img"), page
    message = browser.find_element(By.CSS_SELECTOR, ".item.message").text
    assert HOSTILE in message
    assert HOSTILE in browser.find_element(By.CSS_SELECTOR, "table.fields").text
    shots(browser, "trajectory")


def test_the_health_checks_verdicts_on_the_overview_and_each_trajectory(
    tmp_path: Path, start_viewer, browser, shots
) -> None:
    from nemo_gym.cli.main import main

    By = _by()
    path = tmp_path / "run" / "rollouts.jsonl"
    path.parent.mkdir()
    lines = [rows.with_turn(rows.rollout(task, 0, 1.0, "It is cold."), hollow=task == 1) for task in range(3)]
    rows.write(path, lines)
    assert main(["eval", "health-check", str(path.parent)]) == 0  # the real command writes the reports
    viewer = start_viewer(path)
    browser.get(viewer.url + "/")
    assert browser.find_element(By.ID, "health-healthy").text == "2"
    assert browser.find_element(By.ID, "health-unhealthy").text == "1"
    assert browser.find_element(By.ID, "health-findings").text == "agent_turn_hollow 1"
    shots(browser, "1-health-overview")

    browser.get(viewer.url + "/run/0/r/1")
    _wait(browser, lambda d: d.find_elements(By.ID, "health-verdict"))
    assert browser.find_element(By.ID, "health-verdict").text == "unhealthy"
    finding = browser.find_element(By.ID, "health-findings").text
    assert "agent_turn_hollow" in finding and "agent turn has no message or tool calls" in finding
    shots(browser, "2-health-trajectory")
    browser.get(viewer.url + "/run/0/r/0")
    _wait(browser, lambda d: d.find_elements(By.ID, "health-verdict"))
    assert browser.find_element(By.ID, "health-verdict").text == "healthy"
    assert not browser.find_elements(By.ID, "health-findings")
