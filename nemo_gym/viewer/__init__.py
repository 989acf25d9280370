"""``gym view``: a local web app over rollout files (overview, list, trajectories, compare, live follow)."""
