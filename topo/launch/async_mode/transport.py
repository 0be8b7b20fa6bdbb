"""The inference slots of async mode: torchrl's ``ProcessSlotTransport``, signalled by nothing a worker can hold.

torchrl's transport publishes a request under one lock every worker and the server take, and answers it through a
multiprocessing ``Event`` (a condition: a lock the server takes to set it, the worker to ask it). A worker stopped or
killed holding either leaves the server, then every worker, waiting on it. Here each slot has two semaphores (a count
has no holder) and two numbers in shared memory, and the slots' tensors are torchrl's own:

- a request: the worker writes its slot's tensors, then the request's number (``asked``), then posts the slot
  (``posted``) and the server's doorbell;
- the server claims a slot by taking its post without waiting (the semaphore orders the writes it then reads), and
  answers the number it read: the response's tensors, then the number (``told``), then a post to the worker
  (``answered``). A number it answered already is not served again;
- the worker waits on its ``answered`` post and takes the response once ``told`` is its own number: a post left by
  its slot's previous worker (killed waiting) only wakes it.

A restart takes back what the slot's dead worker posted and the server has not claimed (:meth:`SlotTransport.forget`);
the new worker numbers its requests on from its slot's. Torch and torchrl are imported by the caller.
"""
from __future__ import annotations

import queue
import time

import torch
from torchrl._comm import MailboxPeerClosedError
from torchrl.modules.inference_server import ProcessSlotTransport
from torchrl.modules.inference_server._client import _NO_INTERACTION_TYPE_CODE, _REMOTE_INTERACTION_TYPE_KEY
from torchrl.modules.inference_server._process_slot import _ProcessSlotFuture

from topo.launch.async_mode.channels import Flag

PEER_CHECK_S = 0.1  # a waiting worker asks whether the server lives this often


class SlotTransport(ProcessSlotTransport):
    """``ProcessSlotTransport``'s slots and server side; its signals per slot, by semaphores and numbers only."""

    def __init__(self, request_spec, response_spec, *, num_slots: int, ctx):
        super().__init__(request_spec, response_spec, num_slots=num_slots, ctx=ctx)
        del self._request_ready, self._request_lock, self._response_events  # torchrl's signals, replaced by:
        self._posted = [ctx.Semaphore(0) for _ in range(num_slots)]
        self._answered = [ctx.Semaphore(0) for _ in range(num_slots)]
        self._asked = ctx.Array("q", num_slots, lock=False)  # each slot's last request number
        self._told = ctx.Array("q", num_slots, lock=False)  # each slot's last answered request number
        self._claimed = [0] * num_slots  # in the server: the number each claimed slot is answered with
        self._peer_alive = Flag(ctx)  # the server lives (its process sets it; its monitor clears it at its end)
        self._peer_alive.set()

    def client(self) -> "SlotClient":
        slot = self._next_client_slot
        if slot >= self._num_slots:
            raise RuntimeError(f"SlotTransport has {self._num_slots} slots; client() was called {slot + 1} times")
        self._next_client_slot += 1
        return SlotClient(self, slot)

    def forget(self, slot: int) -> None:
        """In the trainer, ``slot``'s worker dead and its next not started: its unclaimed post taken back."""
        while self._posted[slot].acquire(False):
            pass

    def drain_slots(self, max_items: int) -> tuple[list[int], list[float]]:
        """Claim the posted slots in round-robin order, waiting on none."""
        slots, submitted_at = [], []
        for offset in range(self._num_slots):
            slot = (self._next_slot + offset) % self._num_slots
            if not self._posted[slot].acquire(False):
                continue
            number = self._asked[slot]
            if number == self._claimed[slot]:  # answered already (a count a restart raced with)
                continue
            self._claimed[slot] = number
            slots.append(slot)
            submitted_at.append(self._submitted_at[slot])
            if len(slots) >= max_items:
                break
        if slots:
            self._next_slot = (slots[-1] + 1) % self._num_slots
        acquired = min(len(slots), self._acquired_signals)  # the doorbells of what was claimed, as torchrl does
        self._acquired_signals -= acquired
        for _ in range(len(slots) - acquired):
            self._work_semaphore.acquire(block=False)
        return slots, submitted_at

    def resolve_batch(self, slots: list[int], results) -> None:
        if not slots:
            return
        self._response_slots[torch.tensor(slots, dtype=torch.long)] = results.select(*self._response_keys, strict=True)
        for slot in slots:
            self._answer(slot, 0)

    def resolve(self, callback: int, result) -> None:
        self._response_slots[callback].update_(result.select(*self._response_keys, strict=True))
        self._answer(callback, 0)

    def resolve_exception(self, callback: int, exc: BaseException) -> None:
        self._exception_queues[callback].put(exc)
        self._answer(callback, 1)

    def _answer(self, slot: int, status: int) -> None:
        self._response_status[slot] = status
        self._told[slot] = self._claimed[slot]
        self._answered[slot].release()


class SlotClient:
    """An env worker's end of its slot: one request in flight (torchrl's ``_ProcessSlotFuture`` waits on it)."""

    def __init__(self, transport: SlotTransport, slot: int):
        self._slot = slot
        self._request_slots, self._response_slots = transport._request_slots, transport._response_slots
        self._request_keys, self._copy_result = transport._request_keys, transport._copy_result
        self._submitted_at, self._response_status = transport._submitted_at, transport._response_status
        self._asked, self._told = transport._asked, transport._told
        self._posted, self._answered = transport._posted[slot], transport._answered[slot]
        self._exceptions, self._work = transport._exception_queues[slot], transport._work_semaphore
        self._peer_alive = transport._peer_alive
        self._response_event = _Answered(self)
        self._number: int | None = None
        self._in_flight = False

    @property
    def client_id(self) -> int:
        return self._slot

    def submit(self, td):
        if self._in_flight:
            raise RuntimeError("one request in flight per slot: wait for its future before submitting another")
        if not self._peer_alive.is_set():
            raise MailboxPeerClosedError("Inference server process closed before request submission.")
        slot = self._slot
        self._request_slots[slot].update_(td.select(*self._request_keys, strict=True))
        code = td.get(_REMOTE_INTERACTION_TYPE_KEY, default=None)
        target = self._request_slots[slot].get(_REMOTE_INTERACTION_TYPE_KEY)
        target.fill_(_NO_INTERACTION_TYPE_CODE) if code is None else target.copy_(code)
        if self._number is None:  # the slot's numbers go on from its previous worker's
            self._number = max(self._asked[slot], self._told[slot])
        self._number += 1
        self._submitted_at[slot] = time.monotonic()
        self._asked[slot] = self._number
        self._in_flight = True
        self._posted.release()
        self._work.release()
        return _ProcessSlotFuture(self)

    def __call__(self, td, timeout: float | None = None):
        return self.submit(td).result(timeout=timeout)

    def _receive(self, timeout: float | None):
        end = None if timeout is None else time.monotonic() + timeout
        slot = self._slot
        while True:
            left = PEER_CHECK_S if end is None else min(PEER_CHECK_S, end - time.monotonic())
            if left <= 0:
                raise queue.Empty(f"Timeout waiting for process slot {slot}.")
            if self._answered.acquire(timeout=left) and self._told[slot] == self._number:
                break
            if not self._peer_alive.is_set():
                self._in_flight = False
                raise MailboxPeerClosedError(f"Inference server process closed before replying to slot {slot}.")
        self._in_flight = False
        if self._response_status[slot]:
            return self._exceptions.get()
        result = self._response_slots[slot]
        return result.clone() if self._copy_result else result


class _Answered:
    """What torchrl's future asks (``is_set``): whether the request in flight has its answer."""

    def __init__(self, client: SlotClient):
        self._client = client

    def is_set(self) -> bool:
        return self._client._told[self._client._slot] == self._client._number
