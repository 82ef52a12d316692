"""kbench serve beside kbench grade on the same files, on the same host, one after the other.

Every sample of a folder is sent over HTTP by CLIENTS threads at once (each sends one, waits
for its result, sends the next); then the same folder is graded by `kbench grade`. Printed and
written to OUT/serve_batch.json: each tool's wall time and samples per hour, the waits for a
result over HTTP (median, 90th percentile; "warm": candidates sent once their problem had a
result), and every sample whose verdict differs between the two.

    python bench/serve_batch.py SUBS --task TASK --out OUT [--clients 8] [-- OPTION...]

OPTIONs go to both tools (--profile quick, --device cpu, --no-timing, --seed is set here).
Each tool builds into a cache of its own under OUT (both cold) unless --cache-dir names one
for both (run a tool once before to time both warm). `--only serve` then `--only grade` run the
two apart (each in a device call of its own, say): the first keeps what it sent in
OUT/serve_sent.json, the second compares. Needs the `serve` extra."""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import secrets
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kbench.problems.discovery import assign, find_files, find_problems

SEED = 20261128


@dataclass
class Sent:
    """One sample sent over HTTP."""

    file: str
    problem: str
    job: str = ""
    sent: float = 0.0  # since the first request, in seconds
    answered: float = 0.0
    status: str = ""  # its verdict, or "failed: ..." where kbench could not grade it
    warm: bool = False  # its problem had a result when it was sent


@dataclass
class Figures:
    samples: int
    clients: int
    serve_s: float
    grade_s: float
    waits_s: list[float] = field(default_factory=list)
    warm_waits_s: list[float] = field(default_factory=list)
    differ: list[str] = field(default_factory=list)
    unanswered: int = 0  # sent but not answered before the server was stopped

    def lines(self) -> list[str]:
        def rate(seconds: float, count: int) -> str:
            return f"{count / seconds * 3600:.0f} samples/h" if seconds else "-"

        def spread(waits: list[float]) -> str:
            if not waits:
                return "none"
            cut = statistics.quantiles(waits, n=10)[-1] if len(waits) > 1 else waits[0]
            return f"median {statistics.median(waits):.1f} s, 90th percentile {cut:.1f} s " \
                   f"({len(waits)})"

        served = self.samples - self.unanswered
        return [f"{self.samples} samples, {self.clients} clients over HTTP",
                f"kbench serve: {self.serve_s:.0f} s, {rate(self.serve_s, served)}",
                f"kbench grade: {self.grade_s:.0f} s, {rate(self.grade_s, self.samples)}",
                f"wait for a result: {spread(self.waits_s)}",
                f"wait once its problem had a result (warm): {spread(self.warm_waits_s)}",
                *([f"not answered over HTTP (the step stopped first): {self.unanswered}"]
                  if self.unanswered else []),
                f"verdicts that differ: {len(self.differ)}", *self.differ]


class Server:
    """`kbench serve` in a process of its own on a free port, its lines kept."""

    def __init__(self, args: list[str], out: Path) -> None:
        self.token = secrets.token_hex(16)
        out.mkdir(parents=True, exist_ok=True)
        # line-buffered: a step killed at its time limit still leaves the server's lines
        self.log = open(out / "serve.log", "w", buffering=1)  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kbench", "serve", "--port", "0", *args],
            env={**os.environ, "KBENCH_SERVE_TOKEN": self.token}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        for line in self.proc.stdout:
            self.log.write(line)
            if found := re.search(r"listening on (http://\S+)", line):
                self.url = found.group(1)
                break
        else:
            raise SystemExit(f"kbench serve did not start: see {out / 'serve.log'}")
        threading.Thread(target=lambda: self.log.writelines(self.proc.stdout), daemon=True
                         ).start()

    def call(self, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data,
                                         headers={"Authorization": f"Bearer {self.token}"})
        for _ in range(600):
            try:
                with urllib.request.urlopen(request, timeout=400) as response:
                    return json.loads(response.read())
            except urllib.error.HTTPError as error:
                if error.code != 429:  # a client over its share waits for its turn
                    raise SystemExit(f"{path}: {error.code} {error.read().decode()}") from None
                time.sleep(1)
        raise SystemExit(f"{path}: refused for ten minutes")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=300)
        self.log.close()


def send_all(server: Server, samples: list[Sent], clients: int, keep: Path) -> float:
    """Every sample sent by ``clients`` threads; the seconds from the first request to the
    last result. What was answered so far is kept in ``keep`` after each answer (a step
    stopped at its time limit keeps it) and said in a line."""
    todo: queue.Queue[Sent] = queue.Queue()
    for sample in samples:
        todo.put(sample)
    answered: set[str] = set()  # problems with a result
    lock = threading.Lock()
    start = time.monotonic()

    def client(name: str) -> None:
        while True:
            try:
                sample = todo.get_nowait()
            except queue.Empty:
                return
            with lock:
                sample.warm = sample.problem in answered
            sample.sent = time.monotonic() - start
            job = server.call("/v1/jobs", {"problem": sample.problem, "client": name,
                                           "source": Path(sample.file).read_text()})
            sample.job = job["id"]
            while job["state"] not in ("done", "failed"):
                job = server.call(f"/v1/jobs/{sample.job}?wait=60")
            sample.answered = time.monotonic() - start
            sample.status = job["result"]["status"] if job["result"] else \
                f"failed: {job['error']}"
            with lock:
                answered.add(sample.problem)
                _keep(keep, time.monotonic() - start, samples)
                done = sum(bool(s.status) for s in samples)
                print(f"{sample.answered:7.1f} s [{done}/{len(samples)}] "
                      f"{Path(sample.file).parent.name}/{Path(sample.file).name}: "
                      f"{sample.status} (waited {sample.answered - sample.sent:.1f} s)",
                      flush=True)

    threads = [threading.Thread(target=client, args=(f"client{k}",)) for k in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.monotonic() - start


def _keep(path: Path, serve_s: float, samples: list[Sent]) -> None:
    path.write_text(json.dumps({"serve_s": serve_s, "sent": [asdict(s) for s in samples]},
                               indent=1))


def graded(subs: Path, task: str, args: list[str], out: Path) -> tuple[float, dict]:
    """`kbench grade` of the folder: its wall time and its results by file."""
    start = time.monotonic()
    with open(out / "grade.log", "w") as log:
        subprocess.run([sys.executable, "-m", "kbench", "grade", str(subs), "--task", task,
                        *args], stdout=log, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - start
    results = json.loads((out / "grade" / "results.json").read_text())
    return seconds, {str(Path(s["path"]).resolve()): s for s in results["submissions"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("subs", type=Path, help="a folder of samples")
    parser.add_argument("--task", required=True, help="the problems, as kbench grade's --task")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--cache-dir", type=Path, help="one build cache for both tools")
    parser.add_argument("--only", choices=("serve", "grade"),
                        help="this tool alone: serve keeps what it sent, grade compares with it")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    args.options = argv[cut + 1:]  # for both tools
    args.out.mkdir(parents=True, exist_ok=True)
    _, problems = find_problems(args.task)
    assigned, unmatched = assign(find_files([str(args.subs)]), problems, [str(args.subs)],
                                 named=True)
    if unmatched:
        raise SystemExit("\n".join(unmatched))
    samples = [Sent(str(s.path.resolve()), p.name) for p, subs in assigned.items() for s in subs]
    samples.sort(key=lambda s: s.file)

    def options(tool: str) -> list[str]:
        cache = args.cache_dir or args.out / f"cache-{tool}"
        return ["--out", str(args.out / tool), "--cache-dir", str(cache), "--seed", str(SEED),
                *args.options]

    sent_file = args.out / "serve_sent.json"
    if args.only != "grade":
        server = Server(["--task", args.task, *options("serve")], args.out)
        try:
            serve_s = send_all(server, samples, args.clients, sent_file)
        finally:
            server.stop()
        _keep(sent_file, serve_s, samples)
        if args.only == "serve":
            print(f"{len(samples)} samples over HTTP in {serve_s:.0f} s; kept in {sent_file}")
            return 0
    else:
        try:
            kept = json.loads(sent_file.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"--only grade: {sent_file}: no kept serve run ({exc})") from None
        serve_s, samples = kept["serve_s"], [Sent(**s) for s in kept["sent"]]
    grade_s, by_file = graded(args.subs, args.task, options("grade"), args.out)
    answered = [s for s in samples if s.status]
    figures = Figures(len(samples), args.clients, serve_s, grade_s,
                      sorted(s.answered - s.sent for s in answered),
                      sorted(s.answered - s.sent for s in answered if s.warm),
                      unanswered=len(samples) - len(answered))
    for sample in answered:
        expected = by_file.get(sample.file, {}).get("status", "no result")
        if sample.status != expected:
            figures.differ.append(f"  {sample.file}: serve {sample.status}, grade {expected}")
    (args.out / "serve_batch.json").write_text(json.dumps(
        {**asdict(figures), "sent": [asdict(s) for s in samples]}, indent=1))
    print("\n".join(figures.lines()))
    return 1 if figures.differ else 0


if __name__ == "__main__":
    sys.exit(main())
