"""A session (kbench.grading.running.session) over HTTP, for rollout workers on other machines:

    POST /v1/jobs        {"problem": ..., "source": ..., "client": ...}  -> the job (202)
    GET  /v1/jobs/ID     ?wait=S: up to S seconds for its result          -> the job
    GET  /v1/health      the queue's depth, what is grading, done, failed
    GET  /v1/problems    the problems' names

Every request carries the operator's token ('Authorization: Bearer TOKEN'); a body is read up
to the size limit and no further. Errors are JSON, {"error": "..."}, naming what was wrong.
Starlette routes the requests and uvicorn serves them (the `serve` extra)."""

from __future__ import annotations

import asyncio
import hmac
import json
import signal
import socket
from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kbench.grading.running.fair_queue import QueueClosed, QueueFull
from kbench.grading.running.session import BadSource, Session, UnknownProblem

MAX_WAIT_S = 300.0  # the longest a GET may wait for a result


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


Handler = Callable[[Request], Awaitable[JSONResponse]]


def app(session: Session, token: str, max_body: int) -> Starlette:
    """The HTTP face of ``session``; ``token``: what every request must carry."""
    expected = f"Bearer {token}".encode()

    def guarded(handler: Handler) -> Handler:
        async def endpoint(request: Request) -> JSONResponse:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return _error(401, "authorization: expected 'Bearer TOKEN' with the token "
                              "kbench serve was started with")
            try:
                return await handler(request)
            except _Refused as refused:
                return _error(refused.status, str(refused))
        return endpoint

    async def submit(request: Request) -> JSONResponse:
        body = await _json_body(request, max_body)
        problem, source = body.get("problem"), body.get("source")
        if not isinstance(problem, str) or not isinstance(source, str):
            raise _Refused(400, "body: expected a JSON object with strings 'problem' and "
                           "'source' (and optionally 'client')")
        client = body.get("client") or request.headers.get("x-kbench-client") or \
            (request.client.host if request.client else "")
        try:
            ticket = await run_in_threadpool(session.submit, problem, source, str(client))
        except UnknownProblem as exc:
            raise _Refused(404, str(exc)) from None
        except BadSource as exc:
            raise _Refused(400, str(exc)) from None
        except QueueFull as exc:
            raise _Refused(429, str(exc)) from None
        except QueueClosed as exc:
            raise _Refused(503, str(exc)) from None
        return JSONResponse(ticket.to_dict(), status_code=200 if ticket.future.done() else 202)

    async def job(request: Request) -> JSONResponse:
        ticket = session.ticket(request.path_params["job"])
        if ticket is None:
            raise _Refused(404, f"job {request.path_params['job']!r}: no such job here (one "
                           "queued when the server stopped is not kept: send it again)")
        wait = _wait_s(request.query_params.get("wait", "0"))
        if wait > 0 and not ticket.future.done():
            await asyncio.wait({asyncio.wrap_future(ticket.future)}, timeout=wait)
        return JSONResponse(ticket.to_dict())

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", **session.health()})

    async def problems(request: Request) -> JSONResponse:
        return JSONResponse({"problems": sorted(session.problems)})

    return Starlette(routes=[
        Route("/v1/jobs", guarded(submit), methods=["POST"]),
        Route("/v1/jobs/{job}", guarded(job), methods=["GET"]),
        Route("/v1/health", guarded(health), methods=["GET"]),
        Route("/v1/problems", guarded(problems), methods=["GET"]),
    ])


async def _json_body(request: Request, limit: int) -> dict:
    """The body as a JSON object, read no further than ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    too_large = f"body: more than this server's limit of {limit} bytes"
    if declared.isdigit() and int(declared) > limit:
        raise _Refused(413, too_large)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > limit:
            raise _Refused(413, too_large)
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _Refused(400, f"body: not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise _Refused(400, "body: expected a JSON object")
    return body


def _wait_s(text: str) -> float:
    try:
        wait = float(text)
    except ValueError:
        raise _Refused(400, f"wait: expected seconds, got {text!r}") from None
    if not 0 <= wait <= MAX_WAIT_S:
        raise _Refused(400, f"wait: expected 0 to {MAX_WAIT_S:g} seconds, got {text!r}")
    return wait


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def run(session: Session, token: str, host: str, port: int, max_body: int,
        say: Callable[[str], None]) -> None:
    """Serve until SIGINT or SIGTERM (uvicorn takes them in this, the main thread)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)  # connections wait from now on, so a client told the address is heard
    say(f"kbench serve: listening on http://{host}:{sock.getsockname()[1]} "
        f"({len(session.problems)} problems, run {session.run_id})")
    server = uvicorn.Server(uvicorn.Config(app(session, token, max_body), log_level="warning",
                                           access_log=False))
    # uvicorn raises the signal that stopped it again once it has: to these handlers, so the
    # caller goes on to close the session and write the reports.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda signum, frame: None)
    server.run(sockets=[sock])
