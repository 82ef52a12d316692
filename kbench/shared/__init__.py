"""What both sides of the trust boundary import, and nothing else: the typed messages
(protocol.py) and the checks decoding runs (wire.py), a problem's inputs drawn under a seed
(inputs.py), outputs as leaves (outputs.py), fingerprints (fingerprint.py) and statistics
(stats.py).

Nothing here imports the rest of kbench: a worker (kbench/worker/) imports only this package,
so the trusted side's code never runs beside a submission (tests/test_house.py checks both).
"""
