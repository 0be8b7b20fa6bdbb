"""The tests' preimported commands behave as the fresh interpreters they replace: exit statuses, streams, environment
(the temp directory it names too), working directory, argv and ``sys.path``, ``__main__`` (a spawned child of a script
imports it), the end of an interpreter (threads joined, ``atexit``), sessions and signals; anything else runs as
``subprocess`` runs it."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from tests import preimported

PY = sys.executable


def script(tmp_path, body: str, name: str = "prog.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_a_python_command_is_forked_from_the_server_that_imported_torch_and_others_are_not(monkeypatch):
    """Its length (57 s beside two CPU hogs): the test process's server starts here if no test before started it (an
    import of torch and torchrl), and the command run fresh imports whatever it imports itself."""
    forked = preimported.popen([PY, "-c", "import sys; print('torch' in sys.modules)"], stdout=subprocess.PIPE,
                               text=True)
    assert isinstance(forked, preimported.Forked) and forked.communicate()[0] == "True\n"
    assert forked.returncode == 0
    with monkeypatch.context() as patched:
        patched.setenv(preimported.SWITCH, "0")
        fresh = preimported.popen([PY, "-c", "import sys; print('torch' in sys.modules)"], stdout=subprocess.PIPE,
                                  text=True)
    assert isinstance(fresh, subprocess.Popen) and fresh.communicate()[0] == "False\n"
    flags = preimported.popen([PY, "-I", "-c", "pass"])
    assert isinstance(flags, subprocess.Popen) and flags.wait() == 0
    other = preimported.run(["sh", "-c", "echo $0"], capture_output=True, text=True)
    assert other.stdout == "sh\n"


@pytest.mark.parametrize("body, code", [
    ("import sys; sys.exit(3)", 3),
    ("import sys; sys.exit('bad')", 1),
    ("raise ValueError('boom')", 1),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL),
    ("raise KeyboardInterrupt", -signal.SIGINT),
    ("import sys; sys.exit(None)", 0),
])
def test_exit_statuses_are_a_fresh_interpreters(tmp_path, body, code):
    forked = preimported.run([PY, "-c", body], capture_output=True, text=True)
    fresh = subprocess.run([PY, "-c", body], capture_output=True, text=True)
    assert forked.returncode == fresh.returncode == code
    assert ("boom" in forked.stderr, "bad" in forked.stderr) == ("boom" in fresh.stderr, "bad" in fresh.stderr)


def test_environment_cwd_argv_path_and_main_of_a_script(tmp_path):
    """Its length (57 s beside two CPU hogs): the forked run's PYTHONPATH is its own, read at import, so it forks
    from a server started for it (an import of torch and torchrl)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper_mod.py").write_text("VALUE = 41\n")
    prog = script(tmp_path, """
        import json, os, sys, tempfile
        import helper_mod
        print(json.dumps({"name": __name__, "file": __file__, "argv": sys.argv, "cwd": os.getcwd(),
                          "path0": sys.path[0], "value": helper_mod.VALUE + 1, "var": os.environ.get("ONLY_HERE"),
                          "home": "HOME" in os.environ, "tmp": tempfile.gettempdir()}))
    """)
    work = tmp_path / "work"
    work.mkdir()
    env = {"ONLY_HERE": "yes", "PYTHONPATH": str(tmp_path / "lib"), "PATH": os.environ["PATH"], "TMPDIR": str(work)}
    seen = {}
    for how, start in (("forked", preimported.run), ("fresh", subprocess.run)):
        done = start([PY, str(prog), "a", "b"], cwd=work, env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        seen[how] = __import__("json").loads(done.stdout)
    assert seen["forked"] == seen["fresh"] == {
        "name": "__main__", "file": str(prog), "argv": [str(prog), "a", "b"], "cwd": str(work),
        "path0": str(tmp_path), "value": 42, "var": "yes", "home": False, "tmp": str(work)}


def test_a_module_runs_as_python_dash_m_runs_it(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "__main__.py").write_text("import sys; print(__name__, __spec__.name, sys.argv[1:])\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    forked = preimported.run([PY, "-m", "pkg", "x"], env=env, capture_output=True, text=True)
    fresh = subprocess.run([PY, "-m", "pkg", "x"], env=env, capture_output=True, text=True)
    assert forked.stdout == fresh.stdout == "__main__ pkg.__main__ ['x']\n"
    missing = preimported.run([PY, "-m", "no_such_module_here"], capture_output=True, text=True)
    assert missing.returncode == 1 and "No module named no_such_module_here" in missing.stderr


def test_a_spawned_child_of_a_forked_script_imports_its_main(tmp_path):
    prog = script(tmp_path, """
        import multiprocessing as mp

        def square(x):
            return x * x

        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                print(pool.map(square, [3]))
    """)
    done = preimported.run([PY, str(prog)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout) == (0, "[9]\n"), done.stderr


def test_the_end_joins_threads_runs_atexit_and_flushes(tmp_path):
    prog = script(tmp_path, """
        import atexit, sys, threading, time
        atexit.register(lambda: print("atexit ran"))
        threading.Thread(target=lambda: (time.sleep(0.5), print("thread done"))).start()
        sys.stdout.write("unflushed")
    """)
    done = preimported.run([PY, str(prog)], capture_output=True, text=True)
    assert done.stdout == "unflushedthread done\natexit ran\n"


def test_streams_merge_and_discard_and_communicate_resumes_after_a_timeout(tmp_path):
    both = preimported.run([PY, "-c", "import sys; print('out', flush=True); print('err', file=sys.stderr)"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert both.stdout == "out\nerr\n" and both.stderr is None
    quiet = preimported.run([PY, "-c", "print('x')"], stdout=subprocess.DEVNULL)
    assert quiet.returncode == 0 and quiet.stdout is None
    slow = preimported.popen([PY, "-c", "import time; print('a', flush=True); time.sleep(2); print('b')"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with pytest.raises(subprocess.TimeoutExpired):
        slow.communicate(timeout=0.5)
    assert slow.poll() is None
    assert slow.communicate(timeout=60) == (b"a\nb\n", b"") and slow.returncode == 0


def test_a_new_session_signals_and_the_status_of_a_killed_command(tmp_path):
    proc = preimported.popen([PY, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline() == "up\n"
    assert os.getsid(proc.pid) == proc.pid and proc.pid != preimported._server().proc.pid
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.2)
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(60) == -signal.SIGTERM
    proc.kill()  # ended and reported: nothing is signalled
    interrupted = preimported.popen([PY, "-c", "import time; print('up', flush=True); time.sleep(600)"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert interrupted.stdout.readline() == "up\n"
    interrupted.send_signal(signal.SIGINT)  # a fresh interpreter's handler: KeyboardInterrupt, then SIGINT
    out, err = interrupted.communicate(timeout=60)
    assert interrupted.returncode == -signal.SIGINT and "KeyboardInterrupt" in err


def test_commands_whose_import_time_variables_differ_fork_from_servers_of_their_own():
    """Its length (38 s beside two CPU hogs): a command with a Ray variable of its own starts a second server, which
    imports torch and torchrl."""
    def parent(env):
        done = preimported.run([PY, "-c", "import os; print(os.getppid())"], env=env, capture_output=True, text=True)
        return int(done.stdout)

    plain, probe = dict(os.environ), {**os.environ, "RAY_TOPO_PROBE": "1"}
    assert parent(plain) == parent(plain) == preimported._server().proc.pid
    assert parent(probe) == parent(probe) != parent(plain)
    assert parent({**plain, "MUJOCO_GL": "osmesa"}) == parent(plain)  # not read by what the server imported


def test_the_server_ends_with_the_test_process_and_a_dead_server_is_started_again(tmp_path):
    """Its length (79 s beside two CPU hogs): a fresh Python that starts a server of its own (an import of torch and
    torchrl), then, its server killed, a second server in this test process."""
    prog = script(tmp_path, """
        import subprocess, sys
        from tests import preimported
        child = preimported.popen([sys.executable, "-c", "pass"])
        print(preimported._server().proc.pid, child.wait(), flush=True)
    """)
    done = subprocess.run([PY, str(prog)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(preimported.ROOT)})
    server, code = map(int, done.stdout.split())
    assert code == 0
    deadline = time.monotonic() + 30
    while _running(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(server)
    first = preimported._server()
    first.proc.kill()
    first.proc.wait()
    assert preimported.run([PY, "-c", "pass"]).returncode == 0 and preimported._server() is not first


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
