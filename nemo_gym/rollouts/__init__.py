"""Rollout collection: materialize dataset rows, run them through agents concurrently, score and aggregate."""
