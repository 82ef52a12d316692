"""Code that runs inside a sandboxed child process, next to a submission (or the reference).

Nothing here is trusted: a submission shares the process and can change any of it. The trusted
side (kbench/grading/ through kbench/sandbox.py) never imports this package; it starts it as
``python -m kbench.worker`` and believes only what it can check itself.
"""
