"""What async env workers share with the trainer, made of nothing a worker can hold: each stops or dies alone.

A multiprocessing ``Event`` is a condition (a lock every asker takes), its ``Queue`` a pipe every writer shares
behind one lock, and a tensor it carries a file descriptor the receiver fetches from the sender: a worker stopped
(SIGSTOP) or killed inside any of them leaves the others, or the trainer, waiting on it for good. Here:

- :class:`Flag` is an event as one byte of shared memory: set, cleared and asked without a lock; ``wait`` polls.
- :class:`Channels` gives every worker a pipe of its own to the trainer. A worker writes each message whole
  (results from a thread of its own, as a queue's feeder does) as bytes: its tensors' contents, pickled by value.
  The trainer reads every pipe without blocking (:mod:`selectors`) and takes a message once all of it is in: a
  stopped writer leaves a part in its own buffer, which its restart throws away (:meth:`Channels.forget`).

A message carries its worker's life (:class:`~topo.launch.async_mode.respawn.Context`): a retired life's is dropped.
"""
from __future__ import annotations

import collections
import fcntl
import multiprocessing
import os
import pickle
import queue
import selectors
import struct
import threading
import time
from typing import Any

POLL_S = 0.005  # a Flag's wait asks this often
PIPE_BYTES = 1 << 20  # each pipe's kernel buffer, where the system allows it (Linux: /proc/sys/fs/pipe-max-size)
RESULT, ERROR = 0, 1  # what a message holds
_HEADER = struct.Struct("!QiB")  # payload length, sender's life, kind


class Flag:
    """``multiprocessing.Event``'s interface over one byte of shared memory: nothing to hold, nothing to wait on."""

    def __init__(self, ctx=None):
        self._value = (ctx or multiprocessing).RawValue("b", 0)

    def set(self) -> None:
        self._value.value = 1

    def clear(self) -> None:
        self._value.value = 0

    def is_set(self) -> bool:
        return bool(self._value.value)

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        while not self._value.value:
            left = POLL_S if end is None else end - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL_S, left))
        return True


class Channels:
    """One pipe per worker to the trainer; the trainer's end (:meth:`take`) never waits on any one worker."""

    def __init__(self, ctx, workers: int):
        self.ends = [ctx.Pipe(duplex=False) for _ in range(workers)]  # (the trainer's reader, the worker's writer)
        self._parts = [_Part() for _ in range(workers)]
        self._ready = {RESULT: collections.deque(), ERROR: collections.deque()}  # (worker, life, payload)
        self._selector = selectors.DefaultSelector()
        for i, (reader, writer) in enumerate(self.ends):
            _widen(writer.fileno())
            os.set_blocking(reader.fileno(), False)
            self._selector.register(reader.fileno(), selectors.EVENT_READ, i)
        self.closed = False

    def writer(self, i: int, kind: int) -> "Sender":
        """What worker ``i``'s process gets, for messages of ``kind``."""
        return Sender(self.ends[i][1], i, kind)

    def take(self, kind: int, timeout: float | None) -> tuple[int, int, bytearray]:
        """The next whole message of ``kind`` from any worker: ``(worker, life, payload)``; raises
        :class:`queue.Empty` after ``timeout`` seconds (None: until one comes)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self._ready[kind]:
            if self.closed:
                raise queue.Empty
            left = None if end is None else max(0.0, end - time.monotonic())
            for key, _ in self._selector.select(left):
                self._read(key.data)
            if not self._ready[kind] and end is not None and time.monotonic() >= end:
                raise queue.Empty
        return self._ready[kind].popleft()

    def _read(self, i: int) -> None:
        """What worker ``i``'s pipe holds now, read straight into its message (one copy)."""
        part, fd = self._parts[i], self.ends[i][0].fileno()
        while True:
            try:
                if part.message is None:
                    got = os.read(fd, _HEADER.size - len(part.header))
                    if not got:
                        return
                    part.header += got
                    if len(part.header) < _HEADER.size:
                        continue
                    size, part.life, part.kind = _HEADER.unpack(part.header)
                    part.message, part.filled = bytearray(size), 0
                if part.filled < len(part.message):
                    got = os.readv(fd, [memoryview(part.message)[part.filled:]])
                    if not got:
                        return
                    part.filled += got
            except BlockingIOError:
                return
            if part.filled == len(part.message):
                self._ready[part.kind].append((i, part.life, part.message))
                part.header, part.message = bytearray(), None

    def forget(self, i: int) -> None:
        """Worker ``i`` is dead: what it wrote and was not whole yet, thrown away (its restart writes afresh)."""
        fd = self.ends[i][0].fileno()
        try:
            while os.read(fd, PIPE_BYTES):
                pass
        except BlockingIOError:
            pass
        self._parts[i] = _Part()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._selector.close()
        for reader, writer in self.ends:
            reader.close()
            writer.close()


class _Part:
    """A message of one worker as far as it came: its header's bytes, then its payload filling."""

    def __init__(self):
        self.header, self.message, self.filled, self.life, self.kind = bytearray(), None, 0, 0, RESULT


class Sender:
    """Worker ``i``'s end for messages of one kind: each written whole, blocking only this worker."""

    def __init__(self, connection, i: int, kind: int):
        self._connection, self.i, self.kind = connection, i, kind
        self._pending: collections.deque | None = None
        self._wake: threading.Condition | None = None

    def __getstate__(self):
        return self._connection, self.i, self.kind

    def __setstate__(self, state):
        self._connection, self.i, self.kind = state
        self._pending, self._wake = None, None

    def send(self, life: int, obj: Any) -> None:
        """Write ``obj`` (its tensors by value) now, from this thread."""
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        _write_all(self._connection.fileno(), _HEADER.pack(len(payload), life, self.kind), payload)

    def send_later(self, life: int, obj: Any) -> None:
        """Pickle ``obj`` now, write it from this process's writer thread (the caller steps on)."""
        payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        if self._pending is None:
            self._pending, self._wake = collections.deque(), threading.Condition()
            threading.Thread(target=self._feed, name="topo-async-sender", daemon=True).start()
        with self._wake:
            self._pending.append((_HEADER.pack(len(payload), life, self.kind), payload))
            self._wake.notify()

    def _feed(self) -> None:
        fd = self._connection.fileno()
        while True:
            with self._wake:
                while not self._pending:
                    self._wake.wait()
                header, payload = self._pending.popleft()
            _write_all(fd, header, payload)


def _write_all(fd: int, *parts: bytes) -> None:
    for part in parts:
        view = memoryview(part)
        while view:
            view = view[os.write(fd, view):]


def _widen(fd: int) -> None:
    try:
        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except OSError:  # above the system's limit: its default
        pass
