"""Helpers that several verifiers share: pulling the final answer out of a model's text."""
