"""The processes a launch started: tracked by pid (with their start time, so a reused pid is never
mistaken for ours), counted, and torn down with SIGTERM, then SIGKILL.
"""
from __future__ import annotations

import os
import time

import psutil


class Tracked:
    """Every process topo started, by pid and role; a pid already gone when first seen counts as dead."""

    def __init__(self) -> None:
        self.procs: dict[int, psutil.Process | None] = {}
        self.roles: dict[int, str] = {}

    def add(self, pid: int, role: str) -> None:
        """Track ``pid``; a known role (from a marker) replaces ``other`` (seen as a descendant)."""
        if role != "other" or pid not in self.roles:
            self.roles[pid] = role
        if pid not in self.procs:
            try:
                self.procs[pid] = psutil.Process(pid)
            except psutil.NoSuchProcess:
                self.procs[pid] = None

    def add_group(self, pgid: int, role: str) -> None:
        """Every live member of process group ``pgid`` (orphans keep the group of their launcher)."""
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == pgid:
                    self.add(proc.pid, role)
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue

    def is_alive(self, pid: int) -> bool:
        proc = self.procs.get(pid)
        return proc is not None and running(proc)

    def alive(self, role: str | None = None) -> list[int]:
        return sorted(pid for pid in self.procs if (role is None or self.roles[pid] == role) and self.is_alive(pid))


def running(proc: psutil.Process) -> bool:
    """Alive and ours: not a zombie, and not a new process that reused the pid."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def descendants(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def terminate(procs: list[psutil.Process], grace: float) -> list[int]:
    """SIGTERM, wait up to ``grace`` s, then SIGKILL what is left; returns the pids that needed SIGKILL."""
    for proc in procs:
        _send(proc, psutil.Process.terminate)
    left = wait(procs, grace)
    for proc in left:
        _send(proc, psutil.Process.kill)
    wait(left, 2.0)
    return sorted(p.pid for p in left)


def wait(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait until none of ``procs`` runs (a zombie counts as gone), at most ``timeout`` s; returns the rest."""
    deadline = time.monotonic() + timeout
    left = [p for p in procs if running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if running(p)]
    return left


def _send(proc: psutil.Process, how) -> None:
    if running(proc):
        try:
            how(proc)
        except psutil.NoSuchProcess:
            pass
