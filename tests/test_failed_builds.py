"""A compiler's error is kept like a build (kbench.host.failed_builds): the same code and
toolchain are not compiled again to fail again; any other input compiles anew; what a
machine's state could have caused is never kept."""

from __future__ import annotations

from conftest import FIXTURES, by_name, fresh_cache, grade, quick_task

from kbench.host import failed_builds
from kbench.results.verdict import Status, Verdict


def test_a_compiler_error_is_kept_and_compiled_again_when_an_input_changes(tmp_path, monkeypatch,
                                                                          compile_checked):
    """In a cache of its own, so the first build is one whatever earlier runs kept; the error
    comes before any torch header, so each compile that the test pays for fails at once."""
    cache = fresh_cache(tmp_path / "cache", compile_checked)
    args = [str(FIXTURES / "build_error_at_once.py"), "--task", str(quick_task(tmp_path)),
            "--device", "cpu", "--no-timing", "--force"]
    first = by_name(grade(args, tmp_path / "out", cache)[1])["build_error_at_once"]
    assert first["status"] == "build_error" and first["build_s"] > 0
    assert "error: expected" in first["reason"]  # the compiler's own diagnosis
    log = tmp_path / "out" / "logs" / "build_error_at_once.build.log"
    said = log.read_text()
    again = by_name(grade(args, tmp_path / "out", cache)[1])["build_error_at_once"]
    assert again["status"] == "build_error" and again["build_s"] == 0
    assert again["reason"].startswith(first["reason"]) and "kept from" in again["reason"]
    # The run's build log, which its reports name, still holds the compiler's output.
    assert "error: expected" in said and log.read_text().endswith(said)
    assert "failed before with the same code" in log.read_text()
    # Another host compiler (or flags): compiled again, and that error kept in turn.
    kept = failed_builds.inputs
    monkeypatch.setattr(failed_builds, "inputs", lambda env: {**kept(env), "cxx": "another"})
    other = by_name(grade(args, tmp_path / "out", cache)[1])["build_error_at_once"]
    assert other["status"] == "build_error" and other["build_s"] > 0
    assert "kept from" not in other["reason"]


def test_what_a_machine_could_have_caused_is_never_kept(tmp_path):
    env, log = {"PATH": "/usr/bin"}, tmp_path / "build.log"
    log.write_text("main.cpp:3:41: error: expected ';' before '}'\n")
    diagnosis = Verdict(Status.BUILD_ERROR, "main.cpp:3:41: error: expected ';' before '}'")
    for verdict in (Verdict(Status.TIMEOUT, "build: no answer within 900 s"),
                    Verdict(Status.CRASHED, "worker killed by signal SIGKILL"),
                    Verdict(Status.BUILD_ERROR, "c++: fatal error: Killed signal terminated "
                            "program cc1plus"),
                    Verdict(Status.BUILD_ERROR, "main.o: No space left on device"),
                    Verdict(Status.BUILD_ERROR, "Error building extension 'l2norm_cpp'"),
                    None):
        failed_builds.keep(tmp_path, env, diagnosis, log)
        assert failed_builds.kept(tmp_path, env, tmp_path / "again.log") is not None
        failed_builds.keep(tmp_path, env, verdict, log)  # a later build, failing otherwise or not
        assert failed_builds.kept(tmp_path, env, tmp_path / "again.log") is None, verdict
