"""Python commands of the tests (``topo launch``, a trainer script) forked from one process per test session that
imported torch, torchrl and topo once, rather than each importing them anew: 3-9 s a process on this machine (by the
day), and a local launch starts two (its trainer and the run's forkserver), the suite's largest cost.

:func:`popen` and :func:`run` take ``subprocess``'s arguments. A command ``[sys.executable, "-m" MODULE | SCRIPT | "-c"
CODE, ...]`` runs in a child forked from the server: the request's environment, working directory, argv, ``sys.path``,
standard streams and temp directory, ``__main__`` as the interpreter makes it, signals at a fresh interpreter's
dispositions, ended as an interpreter ends (non-daemon threads joined, ``atexit`` run, streams flushed). The server
reports each child's wait status, so what the test holds is a ``subprocess.Popen`` in all it uses: pid, pipes, poll,
wait, communicate, signals. What stays the server's: the exec-time environment (``/proc/PID/environ``: topo reads it
only of the processes a run starts, and the run's forkserver is still exec'd), what its imports read of the environment
(a command whose :data:`IMPORT_TIME` variables differ forks from a server started with them), and the hash seed (a test
of reproducibility across processes runs its commands with ``subprocess``). Any other command runs as ``subprocess``
runs it; with ``TOPO_TEST_PREIMPORTED=0``, every command does.
"""
from __future__ import annotations

import atexit
import builtins
import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import types
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SWITCH = "TOPO_TEST_PREIMPORTED"
#: imported once by the server: what a trainer and ``topo launch`` import (none of it opens GL or CUDA)
PRELOAD = ("torch", "numpy", "torchrl.envs", "torchrl.collectors", "topo.launch.command", "topo.launch.run",
           "topo.launch.trainer", "topo.api", "topo.cli")
#: variables that :data:`PRELOAD` reads as it is imported (Ray's authentication and config: torchrl imports ray; torch's
#: thread pools and devices; the interpreter's own but the path): commands whose values differ fork from servers of
#: their own, the one used longest ago ended past MAX_SERVERS (once its children are reported)
IMPORT_TIME = ("RAY_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "TORCH", "CUDA_", "PYTHON")
MAX_SERVERS = 3
PIPE, DEVNULL, STDOUT = subprocess.PIPE, subprocess.DEVNULL, subprocess.STDOUT
_HEADER = struct.Struct("=Q")
_INT = struct.Struct("=i")


def popen(args: list[str], *, env: dict | None = None, cwd: Any = None, stdin: Any = None, stdout: Any = None,
          stderr: Any = None, text: bool = False, start_new_session: bool = False, **kwargs: Any):
    """``subprocess.Popen(args, ...)``: a :class:`Forked` for a Python command, else a ``subprocess.Popen``."""
    request = _request(args)
    if request is not None and os.environ.get(SWITCH) != "0" and set(kwargs) <= {"preexec_fn"}:
        if kwargs.get("preexec_fn", default_sigint) is default_sigint:  # a forked command has SIGINT so
            return Forked(args, request, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=text,
                          start_new_session=start_new_session)
    return subprocess.Popen(args, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, text=text,
                            start_new_session=start_new_session, **kwargs)


def default_sigint() -> None:
    """A ``preexec_fn``: SIGINT at its default in a command that ``subprocess`` execs (pytest-xdist's workers ignore
    it, and a Python started with it ignored keeps ignoring it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run(args: list[str], *, capture_output: bool = False, timeout: float | None = None, check: bool = False,
        stdout: Any = None, stderr: Any = None, **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run``, its command started by :func:`popen`."""
    if capture_output:
        stdout = stderr = PIPE
    proc = popen(args, stdout=stdout, stderr=stderr, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, args, out, err)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _import_time(env: Any) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and k != "PYTHONPATH"}


def _request(args: list[str]) -> dict | None:
    args = [str(a) for a in args]
    if len(args) < 2 or os.path.realpath(args[0]) != os.path.realpath(sys.executable):
        return None
    if args[1] in ("-m", "-c") and len(args) > 2:
        return {"kind": "module" if args[1] == "-m" else "code", "target": args[2], "argv": args[3:]}
    if not args[1].startswith("-"):
        return {"kind": "script", "target": os.path.abspath(args[1]), "argv": args[2:]}
    return None  # interpreter flags: a fresh interpreter


class Forked:
    """A command forked from the session's server, held as a ``subprocess.Popen`` is."""

    def __init__(self, args: list[str], request: dict, *, env, cwd, stdin, stdout, stderr, text, start_new_session):
        self.args, self.returncode, self._text = args, None, text
        self._streams: dict[int, Any] = {}  # 0, 1, 2 -> this process's end of a pipe to the child
        self._read: dict[int, list[bytes]] = {1: [], 2: []}  # what communicate read so far
        ours: list[int] = []  # the child's ends made here: closed once the server holds them
        child_out = self._end(stdout, 1, ours)
        fds = [self._end(stdin, 0, ours), child_out, child_out if stderr == STDOUT else self._end(stderr, 2, ours)]
        self.stdin, self.stdout, self.stderr = (self._streams.get(fd) for fd in (0, 1, 2))
        self._status, status_w = os.pipe()
        ours.append(status_w)
        request = {**request, "env": dict(os.environ if env is None else env),
                   "cwd": os.path.abspath(cwd if cwd is not None else os.getcwd()), "session": start_new_session}
        try:
            self.pid = _server(request["env"]).fork(request, [*fds, status_w], self)
        finally:
            for fd in ours:
                os.close(fd)

    def _end(self, how: Any, fd: int, ours: list[int]) -> int:
        """The child's descriptor for its stream ``fd``; of a pipe, this process's end goes to ``_streams``."""
        if how is None:
            return fd
        if how == DEVNULL:
            ours.append(os.open(os.devnull, os.O_RDWR))
            return ours[-1]
        if how == PIPE:
            r, w = os.pipe()
            mine, theirs = (w, r) if fd == 0 else (r, w)
            mode = ("w" if fd == 0 else "r") + ("" if self._text else "b")
            self._streams[fd] = open(mine, mode, **({"encoding": "utf-8"} if self._text else {}))
            ours.append(theirs)
            return theirs
        return how if isinstance(how, int) else how.fileno()

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        with selectors.DefaultSelector() as ready:
            ready.register(self._status, selectors.EVENT_READ)
            if not ready.select(timeout):
                raise subprocess.TimeoutExpired(self.args, timeout)
        data = b""
        while len(data) < _INT.size:
            more = os.read(self._status, _INT.size - len(data))
            if not more:
                raise RuntimeError(f"the preimported server ended before reporting how pid {self.pid} ended")
            data += more
        os.close(self._status)
        self.returncode = os.waitstatus_to_exitcode(_INT.unpack(data)[0])
        return self.returncode

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        """Read stdout and stderr to their ends, then wait; past ``timeout``, ``TimeoutExpired``, and what was read
        is kept for the next call (as ``subprocess`` does)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.stdin is not None and not self.stdin.closed:
            self.stdin.close()
        with selectors.DefaultSelector() as sel:
            for fd in (1, 2):
                stream = self._streams.get(fd)
                if stream is not None and not stream.closed:
                    sel.register(stream.fileno(), selectors.EVENT_READ, fd)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout)
                for key, _ in sel.select(left):
                    data = os.read(key.fd, 65536)
                    if data:
                        self._read[key.data].append(data)
                    else:
                        sel.unregister(key.fd)
                        self._streams[key.data].close()
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._output(1), self._output(2)

    def _output(self, fd: int) -> Any:
        if fd not in self._streams:
            return None
        data = b"".join(self._read[fd])
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n") if self._text else data

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # not reported ended: the pid is still the child's
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Server:
    """The test process's side of a server: started for the first command with its import-time variables, ended
    when this process ends (or past :data:`MAX_SERVERS`)."""

    def __init__(self, import_time: dict[str, str]) -> None:
        folder = tempfile.mkdtemp(prefix="topo-preimported-")
        atexit.register(shutil.rmtree, folder, True)
        self.address = os.path.join(folder, "socket")
        self.children: weakref.WeakSet[Forked] = weakref.WeakSet()
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(self.address)
        listener.listen(64)
        alive_r, self._alive_w = os.pipe()  # the server exits once this end closes
        paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {k: v for k, v in os.environ.items() if k not in _import_time(os.environ)}
        env.update(import_time, PYTHONPATH=os.pathsep.join([str(ROOT), *paths]))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; from tests.preimported import serve; serve(*map(int, sys.argv[1:]))",
             str(listener.fileno()), str(alive_r)], pass_fds=(listener.fileno(), alive_r), cwd=ROOT, env=env,
            stdin=DEVNULL, stdout=DEVNULL)
        listener.close()
        os.close(alive_r)

    def fork(self, request: dict, fds: list[int], child: Forked) -> int:
        payload = json.dumps(request).encode()
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(self.address)
            socket.send_fds(conn, [_HEADER.pack(len(payload))], fds)
            conn.sendall(payload)
            data = _exactly(conn, _INT.size)
        if len(data) < _INT.size or _INT.unpack(data)[0] < 0:
            raise RuntimeError(f"the preimported server could not fork {request['kind']} {request['target']}")
        self.children.add(child)
        return _INT.unpack(data)[0]

    def idle(self) -> bool:
        return all(child.poll() is not None for child in list(self.children))

    def end(self) -> None:
        os.close(self._alive_w)
        self.proc.wait()


_lock = threading.Lock()
_servers: OrderedDict[tuple, _Server] = OrderedDict()  # by import-time variables, the one used last at the end


def _server(env: Any = None) -> _Server:
    """The server for commands with ``env``'s import-time variables (this process's by default)."""
    key = tuple(sorted(_import_time(os.environ if env is None else env).items()))
    with _lock:
        server = _servers.pop(key, None)
        if server is None or server.proc.poll() is not None:
            server = _Server(dict(key))
        _servers[key] = server
        for old in [k for k in _servers if k != key][:max(0, len(_servers) - MAX_SERVERS)]:
            if _servers[old].idle():
                _servers.pop(old).end()
        return server


def _exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = conn.recv(n - len(data))
        if not more:
            break
        data += more
    return data


# ---- the server process ----------------------------------------------------------------------------------------

def serve(listener_fd: int, alive_fd: int) -> None:
    """Import :data:`PRELOAD`, then fork a child per request until the test process ends."""
    for module in PRELOAD:
        __import__(module)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    own_path = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if p not in own_path]
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    statuses: dict[int, int] = {}  # child pid -> the fd its wait status is written to
    listener = socket.socket(fileno=listener_fd)
    sel = selectors.DefaultSelector()
    for fd in (listener_fd, alive_fd, wake_r):
        sel.register(fd, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fd == alive_fd:
                os._exit(0)
            if key.fd == wake_r:
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_r, 512):
                        pass
                _reap(statuses)
            if key.fd == listener_fd:
                conn, _ = listener.accept()
                with conn:
                    header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 4)
                    header += _exactly(conn, _HEADER.size - len(header))
                    request = json.loads(_exactly(conn, _HEADER.unpack(header)[0]))
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        sel.close()
                        listener.close()
                        conn.close()
                        for fd in (alive_fd, wake_r, wake_w, fds[3], *statuses.values()):
                            os.close(fd)
                        _child(request, fds[:3], base_path)
                    statuses[pid] = fds[3]
                    for fd in set(fds[:3]):
                        os.close(fd)
                    conn.sendall(_INT.pack(pid))


def _reap(statuses: dict[int, int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = statuses.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.write(fd, _INT.pack(status))
            os.close(fd)


def _child(request: dict, fds: list[int], base_path: list[str]) -> None:
    """Become the requested command; never returns."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if request["session"]:
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds) - {0, 1, 2}:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    import multiprocessing
    import tempfile

    import numpy

    tempfile.tempdir = None  # the server's imports asked it once: read from this environment, as a fresh one reads it

    # a fresh interpreter's own authkey and numpy stream (``random`` reseeds itself in a forked child)
    multiprocessing.current_process().authkey = os.urandom(32)
    numpy.random.seed(int.from_bytes(os.urandom(4), "little"))
    kind, target = request["kind"], request["target"]
    first = os.path.dirname(os.path.realpath(target)) if kind == "script" else (os.getcwd() if kind == "module" else "")
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *base_path]
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    code, interrupted = 0, False
    try:
        if kind == "module":
            import runpy

            sys.argv = ["-m", *request["argv"]]
            runpy._run_module_as_main(target, alter_argv=True)  # what ``python -m`` runs
        elif kind == "script":
            sys.argv = [target, *request["argv"]]
            main.__file__, main.__cached__ = target, None
            with open(target, "rb") as f:
                source = f.read()
            exec(compile(source, target, "exec"), main.__dict__)
        else:
            sys.argv = ["-c", *request["argv"]]
            exec(compile(target, "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, interrupted = 1, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _end(code, interrupted)


def _exit_code(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _end(code: int, interrupted: bool) -> None:
    """As the interpreter ends: non-daemon threads joined, ``atexit`` functions run, streams flushed; an uncaught
    KeyboardInterrupt ends by SIGINT."""
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)
