"""A throwaway local Ray cluster for the Ray launch tests: ``ray start --head --block`` and, for each further
"machine" on this host, ``ray start --block --address=...`` (:class:`RayNode`), each stopped by its process group.

Not ``ray stop``: that ends every Ray process of this user on the machine, not only this cluster's.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import psutil

RAY = Path(sys.executable).with_name("ray")
# token auth stays off for this private cluster and its drivers, whatever ~/.ray/auth_token holds
ENV = {**os.environ, "RAY_AUTH_MODE": "disabled", "MUJOCO_GL": "egl"}  # a cluster set up to render
STARTED = "Ray runtime started."  # what ``ray start`` prints once its node runs (before it blocks)
PORT_FLAGS = ("port", "ray-client-server-port", "dashboard-port", "dashboard-agent-listen-port",
              "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayHead:
    """One head node on 127.0.0.1 with ``cpus`` CPUs, custom ``resources``, and its own ports and temp dir; with a
    ``token``, Ray's token authentication on (``env``: what a driver of it needs); with ``tmpdir``, its processes'
    and drivers' ``TMPDIR`` (what they leave there is theirs alone)."""

    def __init__(self, cpus: int = 2, timeout: float = 60.0, resources: dict[str, float] | None = None,
                 token: str | None = None, tmpdir: str | None = None):
        self.env = {**ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else ENV
        if tmpdir:
            self.env = {**self.env, "TMPDIR": tmpdir}
        # Ray's unix sockets live under the temp dir: keep its path short (pytest's tmp_path is too long)
        self.temp_dir = tempfile.mkdtemp(prefix="topo-ray-")
        ports = {flag: free_port() for flag in PORT_FLAGS}
        self.address = f"127.0.0.1:{ports['port']}"
        self.log = Path(self.temp_dir, "head.log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(RAY), "start", "--head", "--block", f"--num-cpus={cpus}", "--include-dashboard=false",
                 "--disable-usage-stats", "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp_dir}",
                 *([f"--resources={json.dumps(resources)}"] if resources else []),
                 *(f"--{flag}={port}" for flag, port in ports.items())],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, cwd=self.temp_dir,
                start_new_session=True)
        self.wait_for(f"/{cpus}.0 CPU", timeout)  # the node has registered its CPUs

    def wait_for(self, text: str, timeout: float) -> None:
        """Until ``ray status`` shows ``text``; stops this node and raises if it never does. ``ray status`` is a
        process importing Ray (about a second of CPU): asked only once this node's ``ray start`` says it started
        (its log, read meanwhile, costs nothing), not every half second of the start."""
        deadline = time.monotonic() + timeout
        while not (started := STARTED in self.log.read_text(errors="replace")) \
                or text not in status(self.address, self.env):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text()[-2000:]
                self.stop()
                raise RuntimeError(f"ray node did not start: {tail}")
            time.sleep(0.5 if started else 0.1)

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the head (it stops its node's processes), then SIGKILL what is left of its process group."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        left = [p for p in psutil.process_iter() if _pgid(p.pid) == self.proc.pid]
        for p in left:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=5)
        self.proc.wait()
        shutil.rmtree(self.temp_dir, ignore_errors=True)


class RayNode(RayHead):
    """A further node joining ``head`` with ``cpus`` CPUs and custom ``resources`` (its own process group)."""

    def __init__(self, head: RayHead, resources: dict[str, float], cpus: int = 2, timeout: float = 60.0):
        self.temp_dir = tempfile.mkdtemp(prefix="topo-rayn-")
        self.env = head.env
        self.address = head.address
        self.log = Path(self.temp_dir, "node.log")
        ports = {flag: free_port() for flag in ("dashboard-agent-listen-port", "dashboard-agent-grpc-port",
                                                "runtime-env-agent-port", "metrics-export-port")}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(RAY), "start", "--block", f"--address={head.address}", f"--num-cpus={cpus}",
                 f"--resources={json.dumps(resources)}", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                 *(f"--{flag}={port}" for flag, port in ports.items())],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, cwd=self.temp_dir,
                start_new_session=True)
        self.wait_for(f"/{next(iter(resources.values())):g}.0 {next(iter(resources))}", timeout)


@contextlib.contextmanager
def two_nodes() -> Iterator[tuple[RayHead, RayNode]]:
    """A head holding custom resource ``node_a`` and a second node holding ``node_b`` (2 CPUs each), both stopped
    at the end, whatever happened to them meanwhile."""
    head = RayHead(cpus=2, resources={"node_a": 1})
    try:
        node = RayNode(head, {"node_b": 1}, cpus=2)
    except BaseException:
        head.stop()
        raise
    try:
        yield head, node
    finally:
        node.stop()
        head.stop()


def status(address: str, env: dict[str, str] = ENV) -> str:
    result = subprocess.run([str(RAY), "status", f"--address={address}"], capture_output=True, text=True, env=env)
    return result.stdout if result.returncode == 0 else ""


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None
