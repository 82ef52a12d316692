"""Timing: a submission timed in rounds alternating with the reference's processes, the timed
outputs verified, the integrity checks, and the samples made into speedups."""
