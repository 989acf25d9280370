"""hf_policy_model: serve a transformers checkpoint (or the embedded GGUF) with token ids and log-probs, on CPU.

The server is :class:`nemo_gym.training.policy_server.HFPolicyModel`; this folder runs it standalone, e.g. to score a
checkpoint written by ``gym train grpo`` with ``gym eval run``.
"""

from nemo_gym.training.policy_server import HFPolicyModel

if __name__ == "__main__":
    HFPolicyModel.run_webserver()
