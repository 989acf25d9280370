"""Training on our environments: the policy, TRL adapters, the token-id chain check and `gym train grpo`."""
