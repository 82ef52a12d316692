"""The trusted side of grading (docs/architecture.md has the map).

Beside the options, a problem's context, a worker's channel and the jobs, four concerns import
one way: running -> timing -> checking, running -> building.
"""
