"""``gym env loadtest``: one environment's capacity, measured on a ladder of concurrencies (see ``ladder.py``)."""
