"""Datasets of agent rows: validation, statistics, collation into training files, and prompt rendering.

The modules are imported directly (``nemo_gym.datasets.collate``, ``.statistics``, ``.render``, ...) so that a data
command loads only what it uses.
"""
