"""Tools for environment authors: scaffolding a new resources server, and running servers' tests and data checks."""
