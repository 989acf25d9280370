"""NeMo Gym's server base-class behaviours: ReverifyMode as a str enum, /verify behind judge_failsafe, the
compute_metrics / get_key_metrics hooks of /aggregate_metrics, skills staging and MCP exposure when not enabled."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar
from unittest.mock import MagicMock

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from nemo_gym.base_resources_server import (
    NEMO_GYM_MCP_METADATA_KEY,
    BaseResourcesServerConfig,
    BaseVerifyRequest,
    BaseVerifyResponse,
    ReverifyMode,
    SimpleResourcesServer,
)
from nemo_gym.errors import ConfigError
from nemo_gym.judge import JudgeError
from nemo_gym.mcp_auto_exposure import maybe_auto_expose
from nemo_gym.metrics import aggregate_verify_responses
from nemo_gym.server_utils import ServerClient
from nemo_gym.skills import SkillsError, load_skill_directory, stage_skills

_SERVER = {"host": "127.0.0.1", "port": 1, "entrypoint": "app.py", "name": "env"}
_ROW = {"responses_create_params": {"input": "q"}, "response": {"id": "r", "output": [], "created_at": 0, "model": "m",
        "object": "response", "parallel_tool_calls": True, "tool_choice": "auto", "tools": []}}  # fmt: skip


class _Config(BaseResourcesServerConfig):
    REVERIFY_MODE: ClassVar[ReverifyMode | str] = "stateless"  # a plain string, as older servers write it


class _Server(SimpleResourcesServer):
    config: _Config

    async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
        if body.responses_create_params.input == "judge down":
            raise JudgeError("judge unreachable", server="judge", url_path="/v1/responses", status=503)
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


class _Hooked(_Server):
    def compute_metrics(self, tasks: list[list[dict[str, Any]]]) -> dict[str, Any]:
        per_task = [{"_ng_task_index": rows[0]["_ng_task_index"], "n": len(rows)} for rows in tasks]
        return {"num_task_groups": len(tasks), "per_task_metrics": per_task}

    def get_key_metrics(self, agent_metrics: dict[str, Any]) -> dict[str, Any]:
        return {"num_task_groups": agent_metrics["num_task_groups"]}


def _client(server_class: type[_Server] = _Server) -> TestClient:
    server = server_class(config=_Config(**_SERVER), server_client=MagicMock(spec=ServerClient))
    return TestClient(server.setup_webserver())


def test_reverify_mode_is_a_str_enum_and_plain_strings_still_work() -> None:
    assert ReverifyMode.STATELESS == "stateless" and isinstance(ReverifyMode.UNKNOWN, str)
    assert ReverifyMode("unsupported") is ReverifyMode.UNSUPPORTED
    assert BaseResourcesServerConfig.REVERIFY_MODE is ReverifyMode.UNKNOWN
    assert _client().get("/reverify_mode").json() == "stateless"
    assert NEMO_GYM_MCP_METADATA_KEY == "mcp"


def test_a_judge_that_cannot_be_asked_makes_a_failure_row_not_an_error() -> None:
    client = _client()
    assert client.post("/verify", json=_ROW).json()["reward"] == 1.0
    answer = client.post("/verify", json={**_ROW, "responses_create_params": {"input": "judge down"}})
    assert answer.status_code == 200
    body = answer.json()
    assert (body["reward"], body["_ng_failure_class"]) == (0.0, "judge_failed")
    assert "judge unreachable" in body["_ng_failure_message"]


def test_aggregate_metrics_uses_the_server_hooks() -> None:
    rows = [{"_ng_task_index": t, "_ng_rollout_index": r, "reward": float(r)} for t in (0, 1) for r in (0, 1, 2)]
    default = _client().post("/aggregate_metrics", json={"verify_responses": rows}).json()
    assert default == aggregate_verify_responses(rows).model_dump()  # no hooks: the same answer as before

    hooked = _client(_Hooked).post("/aggregate_metrics", json={"verify_responses": rows}).json()
    assert hooked["key_metrics"] == {"num_task_groups": 2}
    assert hooked["agent_metrics"]["num_task_groups"] == 2 and "mean/reward" in hooked["agent_metrics"]
    assert [group["n"] for group in hooked["group_level_metrics"]] == [3, 3]


def _skill(root: Path, name: str, frontmatter: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "SKILL.md").write_text(frontmatter)


def test_skills_are_read_hashed_and_staged(tmp_path: Path) -> None:
    source = tmp_path / "skills"
    _skill(source, "calc", "---\nname: calc\ndescription: adds\nmetadata:\n  version: 2\n---\nbody\n")
    ref = load_skill_directory(str(source))
    assert [(s.name, s.description, s.version) for s in ref.skills] == [("calc", "adds", "2")]
    (source / "calc" / "SKILL.md").write_text("---\nname: calc\n---\nchanged\n")
    assert load_skill_directory(str(source)).hash != ref.hash  # an in-place edit is a different variant

    stage_skills(str(source), tmp_path / "home" / "skills")
    assert (tmp_path / "home" / "skills" / "calc" / "SKILL.md").read_text().endswith("changed\n")


def test_unusable_skills_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(SkillsError, match="does not exist"):
        load_skill_directory(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="not a directory"):  # NeMo Gym's callers catch ValueError
        stage_skills(str(tmp_path / "missing"), tmp_path / "dest")
    _skill(tmp_path / "bad", "x", "no frontmatter")
    with pytest.raises(SkillsError, match="frontmatter"):
        load_skill_directory(str(tmp_path / "bad"))
    assert issubclass(SkillsError, ConfigError)


def test_mcp_exposure_is_off_unless_asked_and_served_when_asked() -> None:
    server = MagicMock()
    server.config.expose_tools_over_mcp = False
    assert maybe_auto_expose(server, MagicMock()) is None
    server.config.expose_tools_over_mcp = True
    server.config.name = "weather"
    server.session_cookie_name = "W___weather"
    app = FastAPI()

    @app.post("/get_weather")
    async def get_weather(body: dict) -> dict:
        """The weather."""
        return {}

    assert set(maybe_auto_expose(server, app) or {}) == {"get_weather"}
    assert maybe_auto_expose(server, app) is not None  # a second call mounts nothing more
    assert [getattr(r, "path", None) for r in app.router.routes].count("/mcp") == 2  # the Route and the Mount


def test_either_reverify_mode_method_can_be_overridden() -> None:
    class _Upstream(_Server):
        async def get_reverify_mode(self) -> ReverifyMode:  # NeMo Gym's name
            return ReverifyMode.UNSUPPORTED

    class _Ours(_Server):
        async def reverify_mode(self) -> ReverifyMode:
            return ReverifyMode.UNKNOWN

    assert _client(_Upstream).get("/reverify_mode").json() == "unsupported"
    assert _client(_Ours).get("/reverify_mode").json() == "unknown"


def test_a_config_field_typed_by_an_enum_takes_its_values(tmp_path: Path) -> None:
    from nemo_gym.config.schemas import find_server_schema

    (tmp_path / "app.py").write_text(
        "from enum import StrEnum\n"
        "from nemo_gym.base_resources_server import BaseResourcesServerConfig, SimpleResourcesServer\n"
        "class Mode(StrEnum):\n    A = 'a'\n    B = 'b'\n"
        "class Config(BaseResourcesServerConfig):\n    mode: Mode = Mode.A\n"
        "class Server(SimpleResourcesServer):\n    config: Config\n"
    )
    schema = find_server_schema(tmp_path, "app.py")
    assert schema is not None
    model = schema.model()
    assert model.model_validate({**_SERVER, "mode": "b"}).mode == "b"  # type: ignore[attr-defined]
    with pytest.raises(ValueError):
        model.model_validate({**_SERVER, "mode": "c"})


@pytest.mark.parametrize(
    "answer",
    [
        {"agent_metrics": {"mean/reward": 0.5}, "key_metrics": {}, "group_level_metrics": [{"_ng_task_index": 0}]},
        {"agent_metrics": {}, "key_metrics": {}, "group_level_metrics": [], "extra": 1},  # ignored, as by the model
        {"agent_metrics": {}, "key_metrics": {}},  # missing: the model's own 500-worthy error
        {"agent_metrics": {}, "key_metrics": {}, "group_level_metrics": [1]},
        {"agent_metrics": [], "key_metrics": {}, "group_level_metrics": []},
        [],
    ],
)
def test_an_aggregate_metrics_answer_is_what_the_model_validates_it_to(answer: object) -> None:
    """The agent takes an answer of the model's shape as parsed (no copy of every per-task dict); anything else goes
    through the model, so the result, or the error, is the model's."""
    import orjson
    from pydantic import ValidationError

    from nemo_gym.base_responses_api_agent import _metrics_answer
    from nemo_gym.metrics import AggregateMetrics

    raw = orjson.dumps(answer)
    try:
        expected = AggregateMetrics.model_validate(orjson.loads(raw))
    except ValidationError as e:
        with pytest.raises(ValidationError) as raised:
            _metrics_answer(raw)
        assert raised.value.errors() == e.errors()
        return
    got = _metrics_answer(raw)
    assert got == expected and got.model_fields_set == expected.model_fields_set
    assert set(AggregateMetrics.model_fields) == {
        "agent_metrics", "key_metrics", "group_level_metrics", "repeat_level_metrics", "perf_summary"
    }  # fmt: skip
    assert "repeat_level_metrics" not in got.model_dump() and "perf_summary" not in got.model_dump()  # empty: left out


def test_the_rows_an_agent_forwards_are_the_bytes_the_model_dumps_to() -> None:
    from nemo_gym.metrics import AggregateMetricsRequest
    from nemo_gym.transport.http_client import dumps

    rows = [{"_ng_task_index": 0, "reward": float("nan"), "nested": {"a": [1, None, "x"]}, "flag": True}]
    assert dumps({"verify_responses": rows}) == dumps(AggregateMetricsRequest(verify_responses=rows))


def test_a_server_that_builds_its_own_app_still_answers_the_launchers_liveness_probe() -> None:
    """NeMo Gym's GymnasiumServer builds a bare ``FastAPI()`` in setup_webserver; the launcher probes ``GET /``."""

    class OwnApp(SimpleResourcesServer):
        def setup_webserver(self) -> FastAPI:
            app = FastAPI()
            app.post("/step")(self.verify)
            return app

        async def verify(self, body: BaseVerifyRequest) -> BaseVerifyResponse:
            return BaseVerifyResponse(**body.model_dump(), reward=1.0)

    server = OwnApp(config=BaseResourcesServerConfig(**_SERVER), server_client=MagicMock(spec=ServerClient))
    app = server.setup_webserver()
    server.setup_liveness(app)
    server.setup_liveness(app)  # idempotent: no route added twice
    client = TestClient(app)
    for path in ("/", "/health", "/livez"):
        assert client.get(path).json() == {"status": "ok"}, path
    assert sum(getattr(route, "path", None) == "/" for route in app.routes) == 1
