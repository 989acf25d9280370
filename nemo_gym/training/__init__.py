"""Training: what trainers read from our environments (rollouts exported as SFT and DPO datasets, trainer adapters)."""
