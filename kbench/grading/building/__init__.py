"""Building: each submission imported once in its own process on the host's build cores, the
builds of a run on one pipeline, and kbench's files watched and put right while code runs."""
