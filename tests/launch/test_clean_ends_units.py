"""Clean ends: what a killed process registered with the resource tracker is released (topo/runtime/tracked.py); a
process ended by a peer's death ends without a traceback on stderr (topo/runtime/quiet.py)."""
import os
import signal
import sys
import threading

import pytest

from topo.runtime import quiet, tracked
from topo.runtime.rundir import RUN_DIR_VAR

def holder(run_dir, names):
    """A run's process: keeps its ledger, makes two named semaphores, frees one, says the other's name, waits."""
    import multiprocessing
    import time

    tracked.keep(run_dir)
    lock = multiprocessing.get_context("spawn").Lock()
    freed = multiprocessing.get_context("spawn").Lock()
    del freed
    names.put(lock._semlock.name)
    time.sleep(60)


def test_a_killed_process_s_semaphores_are_unlinked_and_unregistered_and_a_freed_one_is_not(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # it shares this process's resource tracker, as a run's processes do
    names = ctx.Queue()
    proc = ctx.Process(target=holder, args=(str(tmp_path), names))
    proc.start()
    name = names.get(timeout=60)
    assert os.path.exists(f"/dev/shm/sem.{name.lstrip('/')}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    ledger = (tmp_path / "resources" / str(proc.pid)).read_text().splitlines()
    assert [line.split()[0] for line in ledger] == ["+", "+", "-"]
    assert len({line.split()[2] for line in ledger}) == 1 and ledger[0].split()[2] != "none"  # one tracker, known

    assert tracked.release(str(tmp_path), proc.pid) == 1
    assert not os.path.exists(f"/dev/shm/sem.{name.lstrip('/')}")
    assert not (tmp_path / "resources" / str(proc.pid)).exists()
    assert tracked.release(str(tmp_path), proc.pid) == 0  # once


UNREGISTERED_BEFORE_ITS_LEDGER = """
import os, sys
from multiprocessing import resource_tracker as rt
from topo.runtime import tracked

run_dir, name = sys.argv[1], "/mp-topo-test-" + str(os.getpid())
tracked.keep(run_dir)
rt.register(name, "semaphore")
rt.unregister(name, "semaphore")  # a process killed right here: its unregister sent, its ledger's "-" not written
os.makedirs(os.path.join(run_dir, "resources"), exist_ok=True)
with open(os.path.join(run_dir, "resources", "999999999"), "w") as f:
    f.write(f"+ semaphore {tracked._tracker()} {name}\\n")
assert tracked.release(run_dir, 999999999) == 1
"""


def test_a_name_its_dead_process_unregistered_before_its_ledger_said_so_is_released_without_a_tracker_error(tmp_path):
    """The ledger's "-" follows the unregister: a process killed between them leaves the name held in its ledger
    but not in the tracker; releasing it must not make the tracker print a KeyError traceback (stderr of the run)."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", UNREGISTERED_BEFORE_ITS_LEDGER, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "KeyError" not in done.stderr, done.stderr


def test_a_dead_process_s_torch_files_are_unlinked_and_no_one_else_s(tmp_path):
    """torch names a shared tensor's file torch_PID_… and unlinks it once opened: a process SIGKILLed between the two
    leaves it in /dev/shm for good (seen once in a whole-suite run)."""
    dead = _dead_pid()
    mine, theirs = f"/dev/shm/torch_{dead}_123_0", f"/dev/shm/torch_{dead + 1}_123_0"
    for path in (mine, theirs):
        open(path, "wb").close()
    try:
        assert tracked.release(str(tmp_path), dead) == 1  # no ledger: the torch file still goes
        assert not os.path.exists(mine) and os.path.exists(theirs)
    finally:
        for path in (mine, theirs):
            if os.path.exists(path):
                os.unlink(path)


def _dead_pid() -> int:
    import subprocess

    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_release_all_spares_the_living(tmp_path):
    folder = tmp_path / "resources"
    folder.mkdir()
    (folder / str(os.getpid())).write_text("+ semaphore none /mp-topo-test-alive\n")
    assert tracked.release_all(str(tmp_path)) == 0
    assert (folder / str(os.getpid())).exists()


def _raise_from(cause):
    try:
        raise cause
    except BaseException as exc:
        try:
            raise RuntimeError("the loop failed") from exc
        except RuntimeError as outer:
            return outer


def _raised_in(filename: str, error: BaseException) -> BaseException:
    namespace = {}
    exec(compile("def fail(error):\n    raise error\n", filename, "exec"), namespace)
    try:
        namespace["fail"](error)
    except BaseException as exc:
        return exc


@pytest.mark.parametrize("exc, peer", [
    (ConnectionRefusedError(111, "refused"), True),  # a dead process's resource sharer
    (_raised_in("/py/multiprocessing/connection.py", OSError(22, "Invalid argument")), True),
    (_raised_in("/home/me/env.py", OSError(22, "Invalid argument")), False),
    (EOFError("proc 12 failed, last command: step."), True),
    (_raise_from(ConnectionResetError(104, "reset")), True),
    (RuntimeError("At least one process failed: worker 0 (exit code -9)."), True),
    (_raise_from(ValueError("a bug")), False),
    (KeyError("x"), False),
])
def test_a_peer_s_death_is_told_from_any_other_error(exc, peer):
    assert quiet.ended_by_a_peer(exc) is peer


def test_run_quietly_writes_a_peer_s_death_to_the_run_directory_and_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(RUN_DIR_VAR, str(tmp_path))

    def broken():
        raise EOFError("proc 12 failed, last command: step.")

    with pytest.raises(SystemExit) as ended:
        quiet.run_quietly("worker", broken)
    assert ended.value.code == 1
    with pytest.raises(SystemExit):  # raised where torchrl checks its workers, once one was found dead
        quiet.run_quietly("subcollector", _check_for_faulty_process, found_dead=("_check_for_faulty_process",))
    written = [p.read_text() for p in (tmp_path / "tracebacks").iterdir()]
    assert len(written) == 2 and sum("proc 12 failed" in text for text in written) == 1
    assert capsys.readouterr().err == ""

    with pytest.raises(ValueError, match="a bug"):  # anything else is raised as before
        quiet.run_quietly("worker", lambda: (_ for _ in ()).throw(ValueError("a bug")))
    with pytest.raises(ValueError, match="Cannot close"):  # the same error elsewhere is raised
        quiet.run_quietly("subcollector", _check_for_faulty_process)
    assert quiet.run_quietly("worker", lambda: 2) == 2


def _check_for_faulty_process():
    raise ValueError("Cannot close a process while it is still running. You should first call join() or terminate().")


def test_the_resource_sharer_is_quiet_when_its_peer_died_and_nothing_else_is(monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *info: seen.append(info[0]))
    quiet.quiet_fd_sharing()
    quiet.quiet_fd_sharing()  # once
    namespace = {"sys": sys}
    # what multiprocessing's resource_sharer._serve does with what it fails on, in its own thread
    exec(compile("def _serve(error):\n    try:\n        raise error\n    except BaseException:\n"
                 "        sys.excepthook(*sys.exc_info())\n", "/x/multiprocessing/resource_sharer.py", "exec"), namespace)
    for error in (ConnectionResetError(104, "reset"), BrokenPipeError(32, "broken"), ValueError("a bug")):
        thread = threading.Thread(target=namespace["_serve"], args=(error,))
        thread.start()
        thread.join()
    try:
        raise ConnectionResetError(104, "reset")  # elsewhere: printed
    except ConnectionResetError:
        sys.excepthook(*sys.exc_info())
    assert seen == [ValueError, ConnectionResetError]


def sender(queue):
    """Puts a tensor (shared through this process's resource sharer), then dies before anyone fetches it."""
    import torch

    queue.put(torch.arange(4))
    queue.close()
    queue.join_thread()  # written to the pipe
    os.kill(os.getpid(), signal.SIGKILL)


def test_an_item_whose_sender_died_before_it_was_read_is_lost_not_the_run_s_failure():
    import multiprocessing
    import queue as queues
    from types import SimpleNamespace

    import torch.multiprocessing  # noqa: F401 - its reductions: a tensor's storage goes by file descriptor

    from topo.launch.local.respawn import _Inbox

    ctx = multiprocessing.get_context("spawn")
    shared = ctx.Queue()
    proc = ctx.Process(target=sender, args=(shared,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    inbox = _Inbox(shared, [], SimpleNamespace(recovery=None))
    with pytest.raises(queues.Empty):
        inbox._get_any(5)
    assert inbox.lost_items == 1
