"""nemo_gym.config_types: every name NeMo Gym documents is exported, and validates or rejects as documented."""

from __future__ import annotations

import warnings
from enum import Enum
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from pydantic import ValidationError

from nemo_gym import config_types as ct

DOCUMENTED_NAMES = """
AgentServerRef AggregateMetrics AggregateMetricsRequest AlmostServerError BaseNeMoGymCLIConfig BaseRunServerConfig
BaseRunServerInstanceConfig BaseRunServerTypeConfig BaseServerConfig BaseServerInstanceConfig BaseServerTypeConfig
BaseUploadJsonlDatasetHuggingFaceConfig BenchmarkDatasetConfig ConfigError ConfigMissingValuesError
ConfigPathNotFoundError DatasetConfig DeleteJsonlDatasetGitlabConfig Domain DownloadJsonlDatasetGitlabConfig
DownloadJsonlDatasetHuggingFaceConfig GitlabDatasetSource HuggingFaceDatasetSource InheritPathNotFoundError
JsonlDatasetGitlabIdentifer JsonlDatasetHuggingFaceIdentifer MalformedConfigPathsError ModelServerRef
NoServerInstancesError ResourcesServerInstanceConfig ResourcesServerRef ResourcesServerTypeConfig
ResponsesAPIAgentServerInstanceConfig ResponsesAPIAgentServerTypeConfig ResponsesAPIModelServerInstanceConfig
ResponsesAPIModelServerTypeConfig ServerRefNotFoundError UploadJsonlDatasetGitlabConfig
UploadJsonlDatasetHuggingFaceConfig UploadJsonlDatasetHuggingFaceMaybeDeleteConfig WANDBConfig is_almost_server
is_server_ref maybe_get_server_instance_config AGENT_REF_KEY DatasetSource DatasetType ServerInstanceConfig
ServerInstanceConfigTypeAdapter ServerRef ServerRefTypeAdapter ServerTypeConfig
""".split()


def test_every_documented_name_is_importable():
    missing = [name for name in DOCUMENTED_NAMES if not hasattr(ct, name)]
    assert missing == []


def test_every_documented_name_is_exported():
    """NeMo Gym's documented names stay in the face's ``__all__`` (the full list is tests/public_api/faces.txt)."""
    assert sorted(set(DOCUMENTED_NAMES) - set(ct.__all__)) == []


def test_agent_ref_key():
    assert ct.AGENT_REF_KEY == "agent_ref"


def test_domain_has_the_twelve_documented_values():
    assert issubclass(ct.Domain, Enum)
    assert {d.value for d in ct.Domain} == {
        "math", "coding", "agent", "knowledge", "instruction_following", "long_context", "safety", "games",
        "translation", "e2e", "rlhf", "other",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("error", "extra_base"),
    [
        (ct.ConfigPathNotFoundError, FileNotFoundError),
        (ct.MalformedConfigPathsError, ValueError),
        (ct.NoServerInstancesError, ValueError),
        (ct.ConfigMissingValuesError, ValueError),
        (ct.ServerRefNotFoundError, ValueError),
        (ct.InheritPathNotFoundError, ValueError),
        (ct.AlmostServerError, ValueError),
    ],
)
def test_error_classes_have_the_documented_bases(error, extra_base):
    assert issubclass(error, ct.ConfigError)
    assert issubclass(error, extra_base)
    assert error.__bases__ == (ct.ConfigError, extra_base)


def _dataset(**overrides):
    return {"name": "train", "type": "train", "jsonl_fpath": "data/train.jsonl", **overrides}


def test_dataset_config_defaults():
    dataset = ct.DatasetConfig(**_dataset())
    assert dataset.num_repeats == 1 and dataset.source is None and dataset.license is None


def test_dataset_config_rejects_a_license_not_in_the_list():
    with pytest.raises(ValidationError, match="license"):
        ct.DatasetConfig(**_dataset(license="WTFPL"))
    assert ct.DatasetConfig(**_dataset(license="Apache 2.0")).license == "Apache 2.0"


def test_dataset_config_rejects_zero_repeats():
    with pytest.raises(ValidationError, match="num_repeats"):
        ct.DatasetConfig(**_dataset(num_repeats=0))


def test_dataset_config_rejects_an_unknown_type():
    with pytest.raises(ValidationError):
        ct.DatasetConfig(**_dataset(type="test"))


def test_source_and_a_legacy_identifier_together_are_rejected():
    with pytest.raises(ValidationError, match="not both"):
        ct.DatasetConfig(
            **_dataset(
                source={"type": "huggingface", "repo_id": "org/repo"},
                huggingface_identifier={"repo_id": "org/repo"},
            )
        )


def test_source_is_mirrored_into_the_legacy_field():
    dataset = ct.DatasetConfig(
        **_dataset(source={"type": "gitlab", "dataset_name": "d", "version": "0.0.1", "artifact_fpath": "t.jsonl"})
    )
    assert isinstance(dataset.source, ct.GitlabDatasetSource)
    assert dataset.gitlab_identifier == ct.JsonlDatasetGitlabIdentifer(
        dataset_name="d", version="0.0.1", artifact_fpath="t.jsonl"
    )
    assert dataset.huggingface_identifier is None


def test_a_single_legacy_identifier_warns_and_is_mirrored_into_source():
    with pytest.warns(DeprecationWarning, match="huggingface_identifier"):
        dataset = ct.DatasetConfig(**_dataset(huggingface_identifier={"repo_id": "org/repo", "artifact_fpath": "a"}))
    assert dataset.source == ct.HuggingFaceDatasetSource(type="huggingface", repo_id="org/repo", artifact_fpath="a")


def test_both_legacy_identifiers_are_allowed_and_leave_source_unset():
    with pytest.warns(DeprecationWarning):
        dataset = ct.DatasetConfig(
            **_dataset(
                gitlab_identifier={"dataset_name": "d", "version": "1.0.0", "artifact_fpath": "t.jsonl"},
                huggingface_identifier={"repo_id": "org/repo"},
            )
        )
    assert dataset.source is None
    assert dataset.gitlab_identifier is not None and dataset.huggingface_identifier is not None


def test_source_without_legacy_fields_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ct.DatasetConfig(**_dataset(source={"type": "huggingface", "repo_id": "org/repo"}))


def test_source_discriminator_rejects_unknown_backends():
    with pytest.raises(ValidationError):
        ct.DatasetConfig(**_dataset(source={"type": "s3", "repo_id": "x"}))


def test_benchmark_dataset_config():
    benchmark = ct.BenchmarkDatasetConfig(
        name="aime", type="benchmark", jsonl_fpath="data/aime.jsonl", prepare_script="prepare.py", num_repeats=32
    )
    assert benchmark.prepare_script == Path("prepare.py") and benchmark.prompt_config is None
    with pytest.raises(ValidationError):
        ct.BenchmarkDatasetConfig(name="a", type="benchmark", jsonl_fpath="a", prepare_script="p", num_repeats=0)


def _resources_block(**inner):
    return {"resources_servers": {"weather": {"entrypoint": "app.py", "domain": "agent", **inner}}}


def test_maybe_get_server_instance_config_accepts_a_valid_server():
    instance, error = ct.maybe_get_server_instance_config("weather_server", _resources_block(extra_setting=3))
    assert error is None
    assert isinstance(instance, ct.ResourcesServerInstanceConfig)
    assert instance.name == "weather_server"
    assert instance.get_inner_run_server_config().entrypoint == "app.py"
    assert instance.get_inner_run_server_config_dict()["extra_setting"] == 3
    assert instance.get_server_ref() == ct.ResourcesServerRef(type="resources_servers", name="weather_server")


def test_resources_servers_need_a_domain():
    instance, error = ct.maybe_get_server_instance_config(
        "x", {"resources_servers": {"weather": {"entrypoint": "app.py"}}}
    )
    assert instance is None and "domain" in str(error)


def test_agents_lift_their_datasets_to_the_instance():
    block = {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py", "datasets": [_dataset()]}}}
    instance, error = ct.maybe_get_server_instance_config("agent", block)
    assert error is None and isinstance(instance, ct.ResponsesAPIAgentServerInstanceConfig)
    assert instance.datasets[0].name == "train"


def test_two_implementations_in_one_instance_are_invalid():
    block = {"responses_api_models": {"a": {"entrypoint": "app.py"}, "b": {"entrypoint": "app.py"}}}
    instance, error = ct.maybe_get_server_instance_config("m", block)
    assert instance is None and error is not None


def test_plain_data_is_not_a_server():
    assert ct.maybe_get_server_instance_config("policy_base_url", {"url": "x"}) == (None, None)
    assert not ct.is_almost_server({"url": "x"})
    assert not ct.is_almost_server("text")


def test_is_almost_server_detects_the_shape():
    assert ct.is_almost_server({"resources_servers": {"weather": {"entrypoint": "app.py"}}})
    assert not ct.is_almost_server({"resources_servers": {"weather": {"domain": "math"}}})


def test_is_server_ref():
    ref = ct.is_server_ref(OmegaConf.create({"type": "responses_api_models", "name": "policy_model"}))
    assert ref == ct.ModelServerRef(type="responses_api_models", name="policy_model")
    assert ct.is_server_ref(OmegaConf.create({"type": "nope", "name": "x"})) is None
    assert ct.is_server_ref(OmegaConf.create({"type": "resources_servers", "name": "x", "more": 1})) is None
    assert ct.ServerRefTypeAdapter.validate_python({"type": "responses_api_agents", "name": "a"}) == ct.AgentServerRef(
        type="responses_api_agents", name="a"
    )


def test_aggregate_metrics_shapes():
    metrics = ct.AggregateMetrics(agent_metrics={"mean/reward": 1.0}, key_metrics={}, group_level_metrics=[])
    assert metrics.model_dump()["agent_metrics"] == {"mean/reward": 1.0}
    request = ct.AggregateMetricsRequest(verify_responses=[{"_ng_task_index": 0, "reward": 1.0}])
    assert request.verify_responses[0]["reward"] == 1.0


def test_wandb_config_defaults():
    assert ct.WANDBConfig(is_available=False).wandb_project is None


def test_migrate_config_forbids_delete_from_gitlab():
    fields = {
        "hf_token": "t", "hf_organization": "o", "hf_collection_name": "c", "hf_collection_slug": "s",
        "input_jsonl_fpath": "x.jsonl", "resource_config_path": "c.yaml",
    }  # fmt: skip
    assert ct.UploadJsonlDatasetHuggingFaceConfig(**fields).split == "train"
    with pytest.raises(ValidationError, match="delete_from_gitlab"):
        ct.UploadJsonlDatasetHuggingFaceConfig(**fields, delete_from_gitlab=True)
    assert ct.UploadJsonlDatasetHuggingFaceMaybeDeleteConfig(**fields, delete_from_gitlab=True).delete_from_gitlab


def test_gitlab_cli_configs_require_their_fields():
    with pytest.raises(ValidationError, match="version"):
        ct.UploadJsonlDatasetGitlabConfig(dataset_name="d", input_jsonl_fpath="x")
    config = ct.DownloadJsonlDatasetGitlabConfig(
        dataset_name="d", version="0.0.1", artifact_fpath="train.jsonl", output_fpath="out.jsonl"
    )
    assert isinstance(config, ct.JsonlDatasetGitlabIdentifer)
    assert ct.DeleteJsonlDatasetGitlabConfig(dataset_name="d").dataset_name == "d"


def test_hf_download_config_needs_exactly_one_target():
    with pytest.raises(ValidationError, match="exactly one"):
        ct.DownloadJsonlDatasetHuggingFaceConfig(repo_id="o/r", artifact_fpath="a")
    config = ct.DownloadJsonlDatasetHuggingFaceConfig(repo_id="o/r", artifact_fpath="a", output_fpath="x")
    assert config.output_fpath == "x"


def test_cli_config_prints_help_and_exits(capsys):
    with pytest.raises(SystemExit) as exit_info:
        ct.DeleteJsonlDatasetGitlabConfig.model_validate({"help": True})
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "Delete a dataset" in out and "dataset_name" in out
