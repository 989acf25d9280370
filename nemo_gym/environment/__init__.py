"""Environments as a catalog sees them: the manifest beside each config, and the checks ``gym env validate`` runs."""
