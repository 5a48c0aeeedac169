"""Trace sampling, the task catalog, calibration and the hidden ground truth of the simulator."""
