"""The trusted side of grading, one stage per module (docs/architecture.md has the map).

Data flows one way: options and context -> building -> correctness -> rounds (with the
reference pool) and integrity -> slot (one submission's verdict) -> executor -> run (the store).
"""
