"""NeMo Gym 0.7's ``AnthropicConverter``: both directions between our Responses API and Anthropic's Messages API.

One class over the two modules that hold the mappings, so nothing is translated twice: serving Messages on top of
our ``/v1/responses`` (``anthropic_messages.py``, what every model server's ``/v1/messages`` does) and Anthropic as the
policy (``anthropic_policy.py``, what ``anthropic_model`` does). The methods take and give our typed models where 0.7's
do; an override (a test that makes one fail, say) is a plain method override.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from nemo_gym.anthropic_messages import message_events, message_from_response, responses_request
from nemo_gym.anthropic_policy import messages_request, response_from_message
from nemo_gym.openai_responses import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.streaming import sse_event

__all__ = ["AnthropicConverter"]


class AnthropicConverter:
    """Stateless: one instance serves any number of calls."""

    # Anthropic as the policy: our request out, its answer back

    def responses_to_anthropic(
        self,
        body: NeMoGymResponseCreateParamsNonStreaming,
        model: str,
        max_tokens: int,
        thinking: dict[str, Any] | None = None,
        thinking_budget_tokens: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The Messages request for ``body``: ``max_tokens`` when the request sets no ``max_output_tokens``,
        ``extra_body`` under what the request sets, and extended thinking when ``thinking`` (as Anthropic spells it)
        or a ``thinking_budget_tokens`` is given."""
        request = {**(extra_body or {}), **messages_request(body.model_dump(mode="json"), model, max_tokens)}
        if thinking is not None:
            request["thinking"] = thinking
        elif thinking_budget_tokens is not None:
            request["thinking"] = {"type": "enabled", "budget_tokens": thinking_budget_tokens}
        return request

    def anthropic_to_responses(
        self, anthropic_response: dict[str, Any], request_body: NeMoGymResponseCreateParamsNonStreaming, model: str
    ) -> NeMoGymResponse:
        """The Response for Anthropic's answer to ``request_body``, named after ``model``."""
        params = request_body.model_dump(mode="json")
        return NeMoGymResponse.model_validate(response_from_message({**anthropic_response, "model": model}, params))

    # Messages served on top of our Responses: a client's request in, our answer out

    def anthropic_request_to_responses(self, anthropic_body: dict[str, Any]) -> NeMoGymResponseCreateParamsNonStreaming:
        """The Responses request that asks what a Messages request asks (``MessagesRequestError`` when it cannot)."""
        return NeMoGymResponseCreateParamsNonStreaming.model_validate(responses_request(anthropic_body))

    def responses_to_anthropic_response(
        self, response: NeMoGymResponse | dict[str, Any], model: str, stop_sequences: list[str] | None = None
    ) -> dict[str, Any]:
        """The Message a client gets for our ``response``, named after ``model``, cut at the first stop sequence."""
        data = response.model_dump(mode="json") if isinstance(response, NeMoGymResponse) else response
        return {**message_from_response(data, stop_sequences), "model": model}

    def anthropic_response_to_sse(self, anthropic_response: dict[str, Any]) -> Iterator[str]:
        """Anthropic's event stream of a finished Message, one encoded event at a time (through :meth:`_sse_event`)."""
        for event in message_events(anthropic_response):
            yield self._sse_event(event["type"], event)

    def _sse_event(self, event_type: str, data: dict[str, Any]) -> str:
        """One event: its name and JSON ``data`` (Anthropic names each event after its ``type``)."""
        return sse_event({**data, "type": event_type}).decode()
