"""kbench as a reward function (kbench.grading.running.session, kbench serve): candidates sent
as source strings, from Python or over HTTP, get the verdicts `kbench grade` gives the same
files; bad requests get clear errors; a server killed and started again keeps what it had
graded."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import FIXTURES, ROOT, grade, quick_task

from kbench.grader import BadSource, Session
from kbench.grading.options import Options
from kbench.grading.running.fair_queue import FairQueue, QueueClosed, QueueFull
from kbench.grading.running.session import check_source

# A correct, a wrong, a crashing and a cheating candidate, with the verdict each earns.
CANDIDATES = {"l2norm_torch_ok": "ok", "l2norm_identity": "wrong_output",
              "l2norm_segfault": "crashed", "l2norm_inplace": "flagged"}
TOKEN = "t0ken-for-the-tests-0123456789"
_SLOW = '''import time

import torch
import torch.nn as nn

time.sleep(60)


class ModelNew(nn.Module):
    def forward(self, x):
        return x / torch.linalg.vector_norm(x, dim=1, keepdim=True)
'''


def _source(name: str) -> str:
    return (FIXTURES / "cpu" / f"{name}.py").read_text()


def test_a_session_grades_sources_as_kbench_grade_grades_the_same_files(tmp_path, cache_dir):
    task = quick_task(tmp_path)
    folder = tmp_path / "subs"
    folder.mkdir()
    for name in CANDIDATES:
        (folder / f"{name}.py").write_text(_source(name))
    code, graded = grade([str(folder), "--task", str(task), "--device", "cpu", "--jobs", "2",
                          "--seed", "11"], tmp_path / "grade", cache_dir)
    assert code == 0
    by_grade = {s["name"]: s["status"] for s in graded["submissions"]}
    assert by_grade == CANDIDATES

    options = Options(device="cpu", out_dir=tmp_path / "session", cache_dir=cache_dir, jobs=2,
                      seed=11)
    with Session(options, str(task)) as session:
        results = session.grade_many([("l2norm", _source(name)) for name in CANDIDATES])
        again = session.submit("l2norm", _source("l2norm_torch_ok"), client="another")
        assert again.future.done() and again.result is results[0]  # one ticket, answered
        with pytest.raises(BadSource, match="not valid Python"):
            session.submit("l2norm", "def f(:\n")
    assert [r.status.value for r in results] == list(CANDIDATES.values())
    assert results[0].speedup is not None and results[0].benchmarks
    stored = json.loads((tmp_path / "session" / "results.json").read_text())
    assert sorted(s["status"] for s in stored["submissions"]) == sorted(CANDIDATES.values())
    assert stored["task"] == "serve l2norm"


def test_a_source_is_checked_before_any_worker_sees_it():
    check_source("import torch\n", 100)
    for source, why in (("", "got nothing"), ("x = 1\n" * 50, "more than this session's "
                        "limit of 100"), ("def f(:\n", r"not valid Python \(line 1"),
                        ("x = 1\0\n", "not valid Python")):
        with pytest.raises(BadSource, match=why):
            check_source(source, 100)


def test_clients_are_served_in_turn_each_within_its_share():
    queue: FairQueue[str] = FairQueue(per_client=3)
    for k in range(3):
        queue.put("a", f"a{k}")
    queue.put("b", "b0")
    with pytest.raises(QueueFull, match="client 'a' has 3 candidates waiting"):
        queue.put("a", "a3")
    assert queue.take(3) == ["a0", "b0", "a1"]
    assert queue.depth() == 1
    queue.close()
    with pytest.raises(QueueClosed):
        queue.put("c", "c0")
    assert queue.take(5) == ["a2"] and queue.take(5) == []


def test_a_burst_of_candidates_goes_as_one_batch():
    # Without the quiet window the session's first batch was the first candidate alone, and
    # the rest of a burst waited for its build and grading before theirs began.
    queue: FairQueue[str] = FairQueue(per_client=4)
    queue.put("a", "a0")

    def burst() -> None:
        for k in range(1, 4):
            time.sleep(0.01)
            queue.put(f"c{k}", f"c{k}")

    sender = threading.Thread(target=burst)
    sender.start()
    assert queue.take(16, quiet_s=5.0) == ["a0", "c1", "c2", "c3"]  # came within 5 s each
    sender.join()
    for k in range(3):
        queue.put("a", f"a{k + 1}")
    started = time.monotonic()
    assert queue.take(2, quiet_s=60.0) == ["a1", "a2"]  # as many as asked for wait: no wait
    assert time.monotonic() - started < 30
    assert queue.take(16, quiet_s=0.0) == ["a3"]


def test_a_session_measures_the_copy_bandwidth_once(tmp_path, cache_dir, monkeypatch):
    # A session holds its problems open; each opened after the first measured the copy
    # bandwidth again (2-3 s on 2 cores) where the run's figure was taken only as one closed.
    from kbench.grading.timing import reference_pool

    task = quick_task(tmp_path)
    second = task.with_name("l2norm_again.yaml")
    second.write_text(task.read_text().replace("name: l2norm\n", "name: l2norm_again\n"))
    measured = []
    real = reference_pool._copy_gbps
    monkeypatch.setattr(reference_pool, "_copy_gbps",
                        lambda ctx, channel: measured.append(ctx.task.name) or real(ctx, channel))
    options = Options(device="cpu", out_dir=tmp_path / "session", cache_dir=cache_dir, jobs=2,
                      seed=11, profile="quick")
    with Session(options, str(task.parent)) as session:
        results = session.grade_many([(name, _source("l2norm_torch_ok"))
                                      for name in ("l2norm", "l2norm_again")])
    assert [r.status.value for r in results] == ["ok", "ok"]
    assert len(measured) == 1, measured


class _Server:
    """`kbench serve` in a process of its own, on a free port."""

    def __init__(self, tmp_path: Path, cache_dir: Path, task: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "KBENCH_SERVE_TOKEN": TOKEN}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kbench", "serve", "--task", str(task), "--device", "cpu",
             "--no-timing", "--port", "0", "--out", str(tmp_path / "served"), "--cache-dir",
             str(cache_dir), "--seed", "5", "--build-jobs", "2", "--max-source-kib", "64",
             "--batch", "8"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        for line in self.proc.stdout:
            self.lines.append(line)
            if found := re.search(r"listening on (http://\S+)", line):
                self.url = found.group(1)
                break
        else:
            raise AssertionError("kbench serve did not start:\n" + "".join(self.lines))
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    def call(self, method: str, path: str, body: dict | bytes | None = None,
             token: str | None = TOKEN, timeout: float = 300) -> tuple[int, dict]:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())
        except urllib.error.URLError as error:
            raise AssertionError(f"{error}; kbench serve printed:\n{''.join(self.lines)}"
                                 ) from None

    def result(self, job: str, within: float = 300) -> dict:
        end = time.monotonic() + within
        while time.monotonic() < end:
            status, answer = self.call("GET", f"/v1/jobs/{job}?wait=30")
            assert status == 200, answer
            if answer["state"] in ("done", "failed"):
                return answer
        raise AssertionError(f"job {job}: no result within {within} s")

    def stop(self, sig: int = signal.SIGTERM) -> str:
        self.proc.send_signal(sig)
        self.proc.wait(timeout=120)
        return "".join(self.lines)


@pytest.fixture
def task(tmp_path) -> Path:
    return quick_task(tmp_path)


def test_eight_clients_at_once_get_the_verdicts_kbench_grade_gives(tmp_path, cache_dir, task):
    server = _Server(tmp_path, cache_dir, task)
    try:
        sources = [_source(name) for name in CANDIDATES] + \
            [_source("l2norm_torch_ok") + f"# client {k}\n" for k in range(4)]
        expected = list(CANDIDATES.values()) + ["ok"] * 4
        answers: list[dict | None] = [None] * len(sources)

        def client(k: int) -> None:
            status, job = server.call("POST", "/v1/jobs", {"problem": "l2norm",
                                                           "source": sources[k],
                                                           "client": f"worker{k}"})
            assert status in (200, 202), job
            answers[k] = server.result(job["id"])

        threads = [threading.Thread(target=client, args=(k,)) for k in range(len(sources))]
        for thread in threads:
            thread.start()
        status, health = server.call("GET", "/v1/health")
        assert status == 200 and health["problems"] == 1
        assert health["waiting"] + health["grading"] + health["done"] <= len(sources)
        for thread in threads:
            thread.join(timeout=600)
        assert [a and a["result"]["status"] for a in answers] == expected
    finally:
        output = server.stop()
    assert "wrote the reports" in output, output
    stored = json.loads((tmp_path / "served" / "results.json").read_text())
    assert len(stored["submissions"]) == len(sources)


def test_bad_requests_get_clear_errors_and_nothing_else(tmp_path, cache_dir, task):
    server = _Server(tmp_path, cache_dir, task)
    try:
        ok = {"problem": "l2norm", "source": _source("l2norm_torch_ok")}
        assert server.call("POST", "/v1/jobs", ok, token=None)[0] == 401
        status, answer = server.call("POST", "/v1/jobs", ok, token="wrong-" + TOKEN)
        assert status == 401 and "Bearer" in answer["error"]
        assert server.call("GET", "/v1/health", token=None)[0] == 401
        status, answer = server.call("POST", "/v1/jobs", {**ok, "problem": "nope"})
        assert status == 404 and "'nope'" in answer["error"] and "l2norm" in answer["error"]
        status, answer = server.call("POST", "/v1/jobs", {**ok, "source": "def f(:\n"})
        assert status == 400 and "not valid Python (line 1" in answer["error"]
        status, answer = server.call("POST", "/v1/jobs", {**ok, "source": "#" * 70_000})
        assert status == 400 and "limit of 65536" in answer["error"]
        status, answer = server.call("POST", "/v1/jobs", b"x" * 300_000)
        assert status == 413 and "limit" in answer["error"]
        status, answer = server.call("POST", "/v1/jobs", b"{not json")
        assert status == 400 and "not valid JSON" in answer["error"]
        status, answer = server.call("POST", "/v1/jobs", {"problem": "l2norm"})
        assert status == 400 and "'source'" in answer["error"]
        status, answer = server.call("GET", "/v1/jobs/0123456789abcdef")
        assert status == 404 and "no such job" in answer["error"]
        status, answer = server.call("GET", "/v1/jobs/x?wait=soon")
        assert status in (400, 404)
        status, answer = server.call("GET", "/v1/health")
        assert status == 200 and answer["waiting"] == answer["grading"] == answer["done"] == 0
        assert server.call("GET", "/v1/problems") == (200, {"problems": ["l2norm"]})
    finally:
        server.stop()


def test_a_server_killed_mid_run_and_started_again_keeps_every_finished_result(
        tmp_path, cache_dir, task):
    server = _Server(tmp_path, cache_dir, task)
    try:
        _, first = server.call("POST", "/v1/jobs", {"problem": "l2norm",
                                                    "source": _source("l2norm_identity")})
        before = server.result(first["id"])
        assert before["result"]["status"] == "wrong_output"
        _, slow = server.call("POST", "/v1/jobs", {"problem": "l2norm", "source": _SLOW})
        deadline = time.monotonic() + 120
        while server.call("GET", f"/v1/jobs/{slow['id']}")[1]["state"] != "grading":
            assert time.monotonic() < deadline, "the slow candidate was never taken up"
            time.sleep(0.2)
    finally:
        server.stop(signal.SIGKILL)
    again = _Server(tmp_path, cache_dir, task)
    try:
        status, after = again.call("GET", f"/v1/jobs/{first['id']}")
        assert status == 200 and after["state"] == "done"
        assert after["result"] == before["result"]
        status, answer = again.call("GET", f"/v1/jobs/{slow['id']}")
        assert status == 404 and "send it again" in answer["error"]
        _, repeat = again.call("POST", "/v1/jobs", {"problem": "l2norm",
                                                    "source": _source("l2norm_identity")})
        assert repeat["state"] == "done" and repeat["id"] == first["id"]
    finally:
        output = again.stop()
    assert re.search(r"taking up run \d+", output), output
