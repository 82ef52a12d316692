"""The machine kbench runs on: its compilers (toolchain.py), content-addressed build folders
(build_dirs.py), the kernel languages' backends (backends/), a submission's needs read from
its source (source_scan.py), what a result was measured on (environment.py), `kbench doctor`
(doctor.py), known GPUs' peaks (peaks.py), process trees (proctree.py) and where kbench reads
and writes (paths.py)."""
