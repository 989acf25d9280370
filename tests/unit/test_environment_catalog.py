"""``gym list environments`` with manifests: each environment's facts from its manifest.yaml, NeMo Gym 0.7's filters
(and the profile and determinism), environments without a manifest listed as ``no-manifest``, a broken manifest told
and never fatal."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nemo_gym.cli.main import main
from nemo_gym.environment.catalog import catalog_entries, filter_entries
from nemo_gym.errors import ConfigError
from tests.helpers import write

CONFIG = "{name}_resources:\n  resources_servers:\n    impl_{name}:\n      entrypoint: app.py\n      domain: {domain}\n"
MANIFEST = """\
name: {name}
version: 1.0.0
experimental: {experimental}
kind: environment
integration_profile: {profile}
domain: {domain}
description: The {name} environment
modality: {modality}
licensing: Apache-2.0
authors: [Someone]
reward: {{range: [0.0, 1.0], higher_is_better: true}}
determinism: {determinism}
resources_server: {name}_resources
agent_server: {name}_agent
model_server: policy_model
datasets:
- {{name: example, type: example, jsonl_fpath: data/example.jsonl}}
lifecycle: {lifecycle}
"""


def environment(root: Path, name: str, domain: str, manifest: dict[str, str] | None = None) -> None:
    write(root / "environments" / name / "config.yaml", CONFIG.format(name=name, domain=domain))
    if manifest is not None:
        write(root / "environments" / name / "manifest.yaml", MANIFEST.format(name=name, domain=domain, **manifest))


@pytest.fixture
def catalog(workdir: Path) -> Path:
    environment(workdir, "alpha", "math", {"experimental": "true", "profile": "custom-gym-verifier",
                "modality": "text", "determinism": "seeded", "lifecycle": "active"})  # fmt: skip
    environment(workdir, "beta", "games", {"experimental": "false", "profile": "custom-gym-agent-loop",
                "modality": "multimodal", "determinism": "stochastic", "lifecycle": "deprecated"})  # fmt: skip
    environment(workdir, "gamma", "math")
    environment(workdir, "delta", "math")
    write(workdir / "environments" / "delta" / "manifest.yaml", "name: delta\nkind: nonsense\n")
    return workdir


def names(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[list[str], str]:
    assert main(["list", "environments", "--json", *flags]) == 0
    captured = capsys.readouterr()
    return [row["name"] for row in json.loads(captured.out) if row["name"] in ("alpha", "beta", "gamma", "delta")], (
        captured.err
    )


def test_each_entry_carries_its_manifest_facts(catalog: Path) -> None:
    entries = {entry.name: entry for entry in catalog_entries()}
    alpha, beta, gamma = entries["alpha"], entries["beta"], entries["gamma"]
    assert (alpha.status, alpha.version, alpha.integration_profile, alpha.licensing) == (
        "experimental", "1.0.0", "custom-gym-verifier", "Apache-2.0",
    )  # fmt: skip
    assert alpha.description == "The alpha environment" and alpha.domain == "math"
    assert beta.status is None and beta.lifecycle == "deprecated"  # a manifest not marked experimental
    assert gamma.status == "no-manifest" and gamma.modality is None
    delta = entries["delta"]
    assert delta.status == "no-manifest" and delta.manifest_error and "delta/manifest.yaml" in delta.manifest_error


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ((), ["alpha", "beta", "delta", "gamma"]),
        (("--status", "experimental"), ["alpha"]),
        (("--status", "no-manifest"), ["delta", "gamma"]),
        (("--domain", "math"), ["alpha", "delta", "gamma"]),
        (("--domain", "math", "--lifecycle", "active"), ["alpha"]),
        (("--modality", "multimodal"), ["beta"]),
        (("--licensing", "Apache-2.0", "--determinism", "stochastic"), ["beta"]),
        (("--integration-profile", "custom-gym-verifier"), ["alpha"]),
    ],
)
def test_filters(catalog: Path, capsys: pytest.CaptureFixture[str], flags: tuple[str, ...], expected: list[str]):
    found, err = names(capsys, *flags)
    assert found == expected
    assert "delta/manifest.yaml" in err  # the broken manifest is told on every listing, in one line


def test_a_filter_says_how_many_entries_it_could_not_judge(catalog: Path, capsys: pytest.CaptureFixture[str]):
    without = sum(entry.modality is None for entry in catalog_entries())  # the install's own environments too
    assert without >= 2
    _, err = names(capsys, "--modality", "text")
    assert f"warning: {without} catalog entries have no modality (no manifest) and could not be matched" in err


def test_the_table_shows_status_and_lifecycle(catalog: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "environments", "--lifecycle", "deprecated"]) == 0
    out = capsys.readouterr().out
    assert "Environments (1)" in out and "beta" in out and "deprecated" in out and "alpha" not in out


def test_bad_filter_values_are_one_line_errors(catalog: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "environments", "--status", "stable"]) == 1
    assert "--status must be one of experimental, no-manifest, got 'stable'" in capsys.readouterr().err
    assert main(["list", "environments", "--kind", "server"]) == 1
    assert "--kind must be environment or benchmark" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown catalog filter"):
        filter_entries([], {"colour": "blue"})
