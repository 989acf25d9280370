"""Finding providers by name, and turning a server's ``sandbox_provider`` setting into a provider config."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from nemo_gym.sandbox import (
    create_provider,
    get_provider_class,
    list_providers,
    register_provider,
    resolve_provider_config,
    resolve_provider_metadata,
    rewrite_image,
)
from nemo_gym.sandbox.providers import registry
from nemo_gym.sandbox.providers.docker import DockerProvider
from nemo_gym.sandbox.providers.local import LocalProvider


class _Provider:
    name = "fake"

    def __init__(self, marker: str = "default") -> None:
        self.marker = marker


@pytest.fixture(autouse=True)
def _isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_registered", {})
    monkeypatch.setattr(registry, "_entry_point_cache", None)
    monkeypatch.setattr(registry, "entry_points", lambda group: [])


def test_builtins_are_listed_and_loaded_on_demand() -> None:
    assert {"apptainer", "docker", "local"} <= set(list_providers())
    assert get_provider_class("local") is LocalProvider
    assert get_provider_class("docker") is DockerProvider


def test_register_and_create() -> None:
    register_provider("fake", _Provider)  # type: ignore[arg-type]
    assert "fake" in list_providers()
    provider = create_provider({"fake": {"marker": "configured"}})
    assert isinstance(provider, _Provider) and provider.marker == "configured"
    assert create_provider({"fake": None}).marker == "default"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="already registered"):
        register_provider("fake", _Provider)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="already registered"):
        register_provider("docker", _Provider)  # type: ignore[arg-type]
    register_provider("docker", _Provider, override=True)  # type: ignore[arg-type]
    assert get_provider_class("docker") is _Provider
    with pytest.raises(ValueError, match="must be non-empty"):
        register_provider("", _Provider)  # type: ignore[arg-type]


def test_create_provider_validates_its_config() -> None:
    with pytest.raises(ValueError, match="exactly one provider name"):
        create_provider({})
    with pytest.raises(ValueError, match="exactly one provider name"):
        create_provider({"local": {}, "docker": {}})
    with pytest.raises(ValueError, match="non-empty string"):
        create_provider({"": {}})
    with pytest.raises(TypeError, match="must be a mapping"):
        create_provider({"local": "not-a-mapping"})
    with pytest.raises(ValueError, match=r"Unknown sandbox provider 'nope'\. Available providers: apptainer, docker"):
        get_provider_class("nope")


def test_entry_points_extend_the_registry(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def entry(name: str, dist: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, dist=SimpleNamespace(name=dist), load=lambda: _Provider)

    monkeypatch.setattr(registry, "entry_points", lambda group: [entry("plugin", "pkg"), entry("local", "pkg")])
    assert "plugin" in list_providers()
    assert get_provider_class("plugin") is _Provider
    assert get_provider_class("local") is LocalProvider  # the built-in wins
    assert "shadowed" in caplog.text

    monkeypatch.setattr(registry, "_entry_point_cache", None)
    monkeypatch.setattr(registry, "entry_points", lambda group: [entry("dup", "pkg-a"), entry("dup", "pkg-b")])
    with pytest.raises(ValueError, match=r"Duplicate sandbox provider entry point 'dup'.*pkg-a.*pkg-b"):
        list_providers()


GLOBAL_CONFIG = {
    "sandbox": {"local": {"network": False}, "default_metadata": {"sandbox-api": "local"}},
    "other_sandbox": {"docker": {}},
    "policy_base_url": "http://x",
    "not_a_sandbox": {"a": 1, "b": 2},
}


def test_resolve_by_name_inline_and_from_omegaconf() -> None:
    assert resolve_provider_config("sandbox", GLOBAL_CONFIG) == {"local": {"network": False}}
    assert resolve_provider_config({"docker": {"exec": {}}}) == {"docker": {"exec": {}}}
    from_yaml = OmegaConf.create({"sandbox": {"local": {"root": "${root}"}}, "root": "/scratch"})
    assert resolve_provider_config("sandbox", from_yaml) == {"local": {"root": "/scratch"}}


def test_resolve_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        resolve_provider_config("", GLOBAL_CONFIG)
    with pytest.raises(ValueError, match=r"'missing' is not defined.*'other_sandbox', 'sandbox'$"):
        resolve_provider_config("missing", GLOBAL_CONFIG)
    with pytest.raises(ValueError, match=r"Available sandbox configs: \(none\)"):
        resolve_provider_config("missing")
    with pytest.raises(TypeError, match="must be a name reference"):
        resolve_provider_config(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exactly one provider key"):
        resolve_provider_config("not_a_sandbox", GLOBAL_CONFIG)
    with pytest.raises(ValueError, match="exactly one provider key"):
        resolve_provider_config({"default_metadata": {}})
    with pytest.raises(ValueError, match="must be a mapping"):
        resolve_provider_config("policy_base_url", GLOBAL_CONFIG)


def test_resolve_metadata() -> None:
    assert resolve_provider_metadata("sandbox", GLOBAL_CONFIG) == {"sandbox-api": "local"}
    assert resolve_provider_metadata("other_sandbox", GLOBAL_CONFIG) == {}
    with pytest.raises(ValueError, match="'default_metadata' from inline sandbox_provider config must be a mapping"):
        resolve_provider_metadata({"local": {}, "default_metadata": ["x"]})


@pytest.mark.parametrize(
    ("image", "rules", "expected"),
    [
        (None, [{"from": "a/", "to": "b/"}], None),
        ("ubuntu:22.04", [], "ubuntu:22.04"),
        ("docker.io/lib/ubuntu", [{"from": "docker.io/", "to": "mirror.local/"}], "mirror.local/lib/ubuntu"),
        ("quay.io/x", [{"from": "docker.io/", "to": "m/"}], "quay.io/x"),
        ("docker.io/x", [{"from": "docker.io/", "to": "first/"}, {"from": "docker", "to": "second/"}], "first/x"),
        ("docker.io/x", [{"from": "", "to": "all/"}], "all/docker.io/x"),
    ],
)
def test_rewrite_image(image: str | None, rules: list[dict[str, str]], expected: str | None) -> None:
    assert rewrite_image(image, rules) == expected
