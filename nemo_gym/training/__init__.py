"""Training on our environments: rollouts exported as SFT and DPO datasets, the policy, TRL adapters, the token-id
chain check and `gym train grpo`."""
