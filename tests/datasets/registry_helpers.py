"""What the registry test modules share: rows, the round trip every backend must pass, and the Hub server."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from nemo_gym.cli.flags import quote
from nemo_gym.datasets.storage import DatasetNotFoundError, DatasetRegistry, RegistryError
from tests.datasets.hub_contract_server import HubContractServer
from tests.helpers import write

ROW_V1 = {"responses_create_params": {"input": "version one"}}
ROW_V2 = {"responses_create_params": {"input": "version two"}}


def jsonl(path: Path, *rows: dict | str) -> Path:
    return write(path, "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def rows_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def registry_round_trip(registry: DatasetRegistry, name: str, tmp: Path) -> None:
    """The contract every versioned backend keeps: versions stay apart, downloads refuse to clobber, rm works."""
    assert registry.list_versions(name) == []
    registry.upload(name, "0.0.1", jsonl(tmp / "v1" / "train.jsonl", ROW_V1))
    registry.upload(name, "0.0.2", jsonl(tmp / "v2" / "train.jsonl", ROW_V2, ROW_V2))
    registry.upload(name, "0.0.2", jsonl(tmp / "v2" / "val.jsonl", ROW_V1), artifact="sub/validation.jsonl")
    assert registry.list_versions(name) == ["0.0.1", "0.0.2"]

    one = registry.download(name, "0.0.1", "train.jsonl", tmp / "out" / "one.jsonl")
    two = registry.download(name, "0.0.2", "train.jsonl", tmp / "out" / "two.jsonl")
    nested = registry.download(name, "0.0.2", "sub/validation.jsonl", tmp / "out" / "nested.jsonl")
    assert (rows_of(one), rows_of(two), rows_of(nested)) == ([ROW_V1], [ROW_V2, ROW_V2], [ROW_V1])

    with pytest.raises(RegistryError, match="already exists"):
        registry.download(name, "0.0.2", "train.jsonl", one)
    assert rows_of(one) == [ROW_V1]
    registry.download(name, "0.0.2", "train.jsonl", one, overwrite=True)
    assert rows_of(one) == [ROW_V2, ROW_V2]
    assert not [p for p in (tmp / "out").iterdir() if p.name.startswith(".")], "no temporary files left behind"

    with pytest.raises(RegistryError, match="already has train.jsonl"):
        registry.upload(name, "0.0.1", jsonl(tmp / "v1b" / "train.jsonl", ROW_V2))
    with pytest.raises(DatasetNotFoundError):
        registry.download(name, "0.0.3", "train.jsonl", tmp / "out" / "missing.jsonl")

    registry.delete(name, "0.0.1")
    assert registry.list_versions(name) == ["0.0.2"]
    with pytest.raises(DatasetNotFoundError):
        registry.download(name, "0.0.1", "train.jsonl", tmp / "out" / "gone.jsonl")
    assert rows_of(registry.download(name, "0.0.2", "train.jsonl", tmp / "out" / "kept.jsonl")) == [ROW_V2, ROW_V2]
    registry.delete(name)
    assert registry.list_versions(name) == []


ORG = "acme"
COLLECTION = "RL Environments"
COLLECTION_SUFFIX = "0123456789abcdef01234567"
REPO = "acme/Nemotron-RL-math-my_env"


@contextlib.contextmanager
def running_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubContractServer]:
    """A fresh contract server, with the client's cache and token lookups kept inside the test's directory."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    server = HubContractServer().start()
    server.add_collection(ORG, COLLECTION, COLLECTION_SUFFIX)
    try:
        yield server
    finally:
        server.stop()


def hf_overrides(hub: HubContractServer) -> list[str]:
    return [
        f"+hf_endpoint={quote(hub.endpoint)}",
        f"+hf_token={hub.token}",
        f"+hf_organization={ORG}",
        f"+hf_collection_name={quote(COLLECTION)}",
        f"+hf_collection_slug={COLLECTION_SUFFIX}",
    ]


def resources_server_config(root: Path) -> Path:
    return write(
        root / "resources_servers" / "my_env" / "configs" / "my_env.yaml",
        "my_env:\n  resources_servers:\n    my_env:\n      entrypoint: app.py\n      domain: MATH\n",
    )
