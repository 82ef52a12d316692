"""`kbench serve`: a grading session (kbench.grading.running.session) over HTTP until SIGINT or
SIGTERM; the run it grades into is taken up again by the next `kbench serve` of the same
problems and settings, so a server stopped or killed keeps every result it had."""

from __future__ import annotations

import argparse
import os
import secrets
import sys

from kbench.cli.grade_command import asked, fail, options_for, placement
from kbench.host import paths

MIN_TOKEN = 16  # characters: a guessable token is no access control


def serve(args: argparse.Namespace) -> int:
    try:
        from kbench.cli import http_api
    except ImportError as exc:
        return fail(f"kbench serve needs the serve extra ({exc.name} is missing): "
                    "pip install 'kbench[serve]'")
    from kbench.grader import Limits, Session
    from kbench.grading.options import OptionsError
    from kbench.problems.discovery import DiscoveryError
    from kbench.problems.task import TaskError
    from kbench.results.store import StoreError

    try:
        token = _token(args)
    except ValueError as exc:
        return fail(str(exc))
    for name in ("max_source_kib", "per_client", "batch"):
        if getattr(args, name) < 1:
            return fail(f"--{name.replace('_', '-')} {getattr(args, name)}: expected at least 1")
    out_dir = (args.out or paths.default_reports_dir()).resolve()
    limits = Limits(source_bytes=args.max_source_kib * 1024, per_client=args.per_client,
                    batch=args.batch)
    try:
        options = options_for(args, asked(args), args.seed if args.seed is not None
                              else secrets.randbits(31), out_dir)
        session = Session(options, args.task, placement(args), limits, _say,
                          any_seed=args.seed is None)
    except (OptionsError, DiscoveryError, TaskError, StoreError) as exc:
        return fail(str(exc))
    try:
        http_api.run(session, token, args.host, args.port, 2 * limits.source_bytes + 65536,
                     _say)
    except OSError as exc:
        session.close(wait=False)
        return fail(f"--host {args.host} --port {args.port}: cannot listen there ({exc})")
    _say(f"kbench serve: stopping; run {session.run_id} keeps "
         f"{session.health()['done']} result(s) (a new `kbench serve` of the same problems "
         "and settings takes it up)")
    session.close(wait=False)
    _say(f"wrote the reports of what was graded to {out_dir / 'index.html'}")
    return 0


def _token(args: argparse.Namespace) -> str:
    """The operator's token; ValueError for a missing or weak one."""
    if args.token_file is not None:
        try:
            token = args.token_file.read_text().strip()
        except OSError as exc:
            raise ValueError(f"--token-file {args.token_file}: cannot read it "
                             f"({exc.strerror})") from None
        where = f"--token-file {args.token_file}"
    else:
        token, where = os.environ.get("KBENCH_SERVE_TOKEN", "").strip(), "$KBENCH_SERVE_TOKEN"
        if not token:
            raise ValueError("no token: set KBENCH_SERVE_TOKEN or pass --token-file (without "
                             "one kbench serve does not start: no token, no access)")
    if len(token) < MIN_TOKEN:
        raise ValueError(f"{where}: the token has {len(token)} characters; expected at least "
                         f"{MIN_TOKEN} (python -c 'import secrets; print(secrets.token_hex())'"
                         " makes one)")
    return token


def _say(line: str) -> None:
    print(line, file=sys.stdout, flush=True)
