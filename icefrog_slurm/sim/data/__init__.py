"""Package data of the simulator: the task catalog and generated per-layer tables."""
