"""Engine adapters for worker-owned staging (``staging.protocols.CaptureAdapter``); each one is dependency-free."""
