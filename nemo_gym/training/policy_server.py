"""The policy model server: ``/v1/responses`` and ``/v1/chat/completions`` answered by an :class:`HFPolicy`.

Two ways to run it. Standalone (``responses_api_models/hf_policy_model``), it loads a checkpoint directory or a GGUF
once, so ``gym eval run`` can score a trained checkpoint like any model. In-process (:func:`serve_policy`), the trainer
hands it the very policy object it optimizes and serves it from a background thread, so the agents' rollouts always
use the newest weights: the refresh between steps is the optimizer step itself.

Every output item carries ``prompt_token_ids`` / ``generation_token_ids`` / ``generation_log_probs`` (like
``vllm_model`` in training mode) and a previous turn's ids come back in through the converter, where
:meth:`HFPolicy.render` splices them instead of re-tokenizing. Generation runs in a worker thread, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

from fastapi import Request, Response

from nemo_gym.base_responses_api_model import BaseResponsesAPIModelConfig, SimpleResponsesAPIModel
from nemo_gym.openai_utils import NeMoGymChatCompletionCreateParamsNonStreaming, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.responses_converter import ResponsesConverter
from nemo_gym.server_utils import json_response
from nemo_gym.training.policy import HFPolicy

__all__ = ["HFPolicyModel", "HFPolicyModelConfig", "serve_policy"]


class HFPolicyModelConfig(BaseResponsesAPIModelConfig):
    model_path: str | None = None
    """A checkpoint directory (``gym train grpo`` writes one) or a GGUF file, as an absolute path (the server runs in
    its own folder); empty = the embedded SmolLM2 GGUF."""
    default_max_output_tokens: int = 256
    """Used when a request sets no ``max_output_tokens``."""
    torch_threads: int | None = None
    """CPU threads for torch; empty = torch's default."""


class HFPolicyModel(SimpleResponsesAPIModel):
    config: HFPolicyModelConfig

    def model_post_init(self, context: Any) -> None:
        if getattr(self, "_policy", None) is None:
            if self.config.torch_threads:
                import torch

                torch.set_num_threads(self.config.torch_threads)
            self._policy = HFPolicy.load(self.config.model_path)
        self._converter = ResponsesConverter(return_token_id_information=True)

    @classmethod
    def around(cls, policy: HFPolicy, config: HFPolicyModelConfig) -> HFPolicyModel:
        """A server for an already loaded policy (the trainer's), without loading weights again."""
        server = cls.model_construct(config=config, server_client=None)  # it calls no other server
        server._policy = policy
        server.model_post_init(None)
        return server

    def model_ids(self) -> list[str]:
        return [self._policy.name]

    async def responses(self, request: Request, body: NeMoGymResponseCreateParamsNonStreaming) -> Response:
        chat = self._converter.responses_to_chat_completion_create_params(body)
        completion = await self._complete(chat.model_dump(mode="json", exclude_unset=True))
        return json_response(self._converter.chat_completion_to_response(body, completion).model_dump(mode="json"))

    async def chat_completions(self, request: Request, body: NeMoGymChatCompletionCreateParamsNonStreaming) -> Response:
        return json_response(await self._complete(body.model_dump(mode="json", exclude_unset=True)))

    async def _complete(self, params: dict[str, Any]) -> dict[str, Any]:
        max_tokens = params.get("max_completion_tokens") or params.get("max_tokens")
        return await asyncio.to_thread(
            self._policy.chat,
            params["messages"],
            tools=params.get("tools"),
            tool_choice=params.get("tool_choice"),
            temperature=params.get("temperature", 1.0),
            top_p=params.get("top_p", 1.0),
            max_tokens=max_tokens or self.config.default_max_output_tokens,
            seed=params.get("seed"),
        )


@contextlib.contextmanager
def serve_policy(policy: HFPolicy, name: str = "policy_model", sock: socket.socket | None = None) -> Iterator[str]:
    """Serve ``policy`` on 127.0.0.1 from a background thread of this process; yields the base URL.

    ``sock``: a bound socket to serve on, e.g. the port the config composer reserved for the ``policy_model``
    instance, so the agents launched from that config find the in-process server where the config says it is.
    """
    from nemo_gym.testing import serve_in_thread

    config = HFPolicyModelConfig(host="127.0.0.1", port=0, entrypoint="app.py", name=name)
    with serve_in_thread(HFPolicyModel.around(policy, config).setup_webserver(), sock) as url:
        yield url
