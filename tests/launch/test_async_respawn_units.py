"""What async env workers share with the trainer and the server, with real processes stopped and killed: a worker
stopped or killed anywhere in a message (:mod:`topo.launch.async_mode.channels`) or a request
(:mod:`topo.launch.async_mode.transport`) blocks no other process; a dead worker's permits come back and its retired
life's messages are dropped (:mod:`topo.launch.async_mode.respawn`)."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import time

import pytest
import torch
from tensordict import TensorDict

from topo.launch.async_mode import channels as async_channels, respawn as async_respawn
from topo.launch.async_mode.transport import SlotTransport

CTX = multiprocessing.get_context("spawn")
BIG = {"pixels": torch.arange(600_000, dtype=torch.int32)}  # 2.4 MB: more than a pipe holds, written in parts


def _send(sender, n: int) -> None:
    for k in range(n):
        sender.send(0, {"k": k, **BIG})
    time.sleep(600)


def _stop_mid_message(sender, stopped) -> None:
    """Half a message written (its header promises all of it), then this process stops itself."""
    data = async_channels._HEADER.pack(10_000, 0, sender.kind) + b"x" * 5_000
    os.write(sender._connection.fileno(), data)
    stopped.set()
    os.kill(os.getpid(), signal.SIGSTOP)


def _ended(proc) -> None:
    if proc.is_alive():
        os.kill(proc.pid, signal.SIGKILL)
    proc.join()


def test_a_worker_stopped_mid_message_blocks_only_itself_and_its_restart_writes_afresh():
    """Worker 0 stops half way through a message; worker 1's messages (each larger than a pipe holds) all come whole;
    asking with a timeout returns at its timeout; once worker 0 is dead and forgotten, its restart's message comes."""
    chans = async_channels.Channels(CTX, 2)
    stopped = async_channels.Flag(CTX)
    procs = [CTX.Process(target=_stop_mid_message, args=(chans.writer(0, async_channels.RESULT), stopped), daemon=True),
             CTX.Process(target=_send, args=(chans.writer(1, async_channels.RESULT), 3), daemon=True)]
    try:
        for proc in procs:
            proc.start()
        assert stopped.wait(60)
        got = [chans.take(async_channels.RESULT, 60) for _ in range(3)]
        assert [(i, life) for i, life, _ in got] == [(1, 0)] * 3
        assert [pickle.loads(p)["k"] for _, _, p in got] == [0, 1, 2]
        assert torch.equal(pickle.loads(got[2][2])["pixels"], BIG["pixels"])
        began = time.monotonic()
        with pytest.raises(queue.Empty):
            chans.take(async_channels.RESULT, 0.5)
        assert time.monotonic() - began < 5
        _ended(procs[0])
        chans.forget(0)
        procs[0] = CTX.Process(target=_send, args=(chans.writer(0, async_channels.RESULT), 1), daemon=True)
        procs[0].start()
        i, life, payload = chans.take(async_channels.RESULT, 60)
        assert (i, pickle.loads(payload)["k"]) == (0, 0)
    finally:
        for proc in procs:
            _ended(proc)
        chans.close()


def _request(client, value: float, answered, stop_after_submit: bool) -> None:
    """One request of ``value``; its answer's action written to ``answered`` (or stopped once submitted)."""
    future = client.submit(TensorDict({"observation": torch.full((2,), value)}))
    if stop_after_submit:
        os.kill(os.getpid(), signal.SIGSTOP)
    answered.value = float(future.result(timeout=60)["action"][0])
    time.sleep(600)


def _serve(transport: SlotTransport, slots_expected: int, timeout: float = 60) -> list[int]:
    """The server's side, here: claim ``slots_expected`` posted slots, answer each with its observation + 100."""
    claimed, end = [], time.monotonic() + timeout
    while len(claimed) < slots_expected and time.monotonic() < end:
        transport.wait_for_work(timeout=0.1)
        slots, _ = transport.drain_slots(8)
        if slots:
            batch = transport.request_batch(len(slots))
            transport.gather_requests(slots, out=batch)
            response = transport.response_batch(len(slots))
            response["action"] = batch["observation"] + 100
            transport.resolve_batch(slots, response)
            claimed += slots
    return claimed


def _transport(slots: int) -> SlotTransport:
    return SlotTransport(TensorDict({"observation": torch.zeros(2)}),
                         TensorDict({"action": torch.zeros(2), "policy_version": torch.zeros((), dtype=torch.long)}),
                         num_slots=slots, ctx=CTX)


def test_a_stopped_client_blocks_no_other_slot_and_a_dead_ones_late_answer_never_reaches_its_restart():
    """Slot 0's worker stops after its request; slot 1's is served all the same. Slot 0's worker is killed with its
    request claimed but not answered; its restart asks again; the late answer to the dead one's request only wakes
    the new worker, which takes the answer to its own."""
    transport = _transport(2)
    answers = [CTX.RawValue("d", -1.0) for _ in range(3)]
    clients = [transport.client(), transport.client()]
    procs = [CTX.Process(target=_request, args=(clients[0], 1.0, answers[0], True), daemon=True),
             CTX.Process(target=_request, args=(clients[1], 2.0, answers[1], False), daemon=True)]
    try:
        for proc in procs:
            proc.start()
        claimed, end = [], time.monotonic() + 60
        while len(claimed) < 2 and time.monotonic() < end:  # both requests claimed: slot 0's kept unanswered
            transport.wait_for_work(timeout=0.1)
            claimed += transport.drain_slots(8)[0]
        assert sorted(claimed) == [0, 1]
        response = transport.response_batch(1)
        response["action"] = torch.full((1, 2), 102.0)
        transport.resolve_batch([1], response)
        end = time.monotonic() + 60
        while answers[1].value < 0 and time.monotonic() < end:
            time.sleep(0.01)
        assert answers[1].value == 102.0  # slot 1 answered, slot 0's worker stopped holding nothing
        _ended(procs[0])
        transport.forget(0)
        procs[0] = CTX.Process(target=_request, args=(clients[0], 3.0, answers[2], False), daemon=True)
        procs[0].start()
        end = time.monotonic() + 60
        while transport._asked[0] < 2 and time.monotonic() < end:  # the restart's request numbered on from the dead one's
            time.sleep(0.01)
        assert transport._asked[0] == 2
        late = transport.response_batch(1)
        late["action"] = torch.full((1, 2), 101.0)
        transport.resolve_batch([0], late)  # the answer to the dead worker's request 1, after the restart asked again
        assert _serve(transport, 1) == [0]
        end = time.monotonic() + 60
        while answers[2].value < 0 and time.monotonic() < end:
            time.sleep(0.01)
        assert answers[2].value == 103.0
    finally:
        for proc in procs:
            _ended(proc)


def _worker(env_id, result_queue, error_queue, result_capacity, chunks: int, blocked) -> None:
    """An async env worker's use of its permits and the result queue (as torchrl's loop): ``chunks`` sent, each
    once a permit is taken; ``blocked`` set while none is left."""
    for n in range(chunks):
        while not result_capacity.acquire(timeout=0.01):
            blocked.set()
        blocked.clear()
        result_queue.put({"chunk": n, "life": env_id})
    time.sleep(600)


def test_each_worker_life_has_its_own_permits_and_a_retired_lifes_results_are_dropped():
    """torchrl's pool of 2 x N permits, a budget of 2 per worker life: the third chunk waits until the trainer took
    one (its release goes to the sender's budget). The worker dies with a chunk unread: its life retired, that chunk
    is dropped; its restart starts with a budget of its own, whatever the dead one held."""
    context = async_respawn.Context(CTX, 2)
    results, errors = context.Queue(maxsize=4), context.Queue()
    permits = context.BoundedSemaphore(4)
    blocked = async_channels.Flag(CTX)
    kwargs = {"env_id": 1, "result_queue": results, "error_queue": errors, "result_capacity": permits, "chunks": 3,
              "blocked": blocked}
    procs = [context.Process(target=_worker, kwargs=kwargs, name="worker-1")]
    try:
        procs[0].start()
        assert [results.get(timeout=60)["chunk"] for _ in range(2)] == [0, 1]
        assert blocked.wait(30)  # its budget of 2 spent: chunk 2 waits for a permit back
        permits.release()  # the trainer's, for chunk 0: to worker 1's budget
        end = time.monotonic() + 30
        while blocked.is_set() and time.monotonic() < end:
            time.sleep(0.01)
        assert not blocked.is_set()  # chunk 2 sent, unread
        _ended(procs[0])
        context.life[1] += 1  # its restart: chunk 2, in its channel, belongs to the retired life
        context.channels.forget(1)
        procs.append(context.start(1, {**context.made[1]["kwargs"], "chunks": 2}))
        procs[1].start()
        assert [results.get(timeout=60)["chunk"] for _ in range(2)] == [0, 1]  # a budget of its own
        permits.release()  # chunk 1 of the retired life: its budget went with it
        with pytest.raises(queue.Empty):
            results.get(timeout=1.0)
        assert results.dropped == 0 and list(permits.taken) == [(1, 1), (1, 1)]
    finally:
        for proc in procs:
            _ended(proc)
        context.channels.close()
