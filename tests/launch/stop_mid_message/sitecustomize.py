"""For the async-mode tests (on PYTHONPATH in them only, so every process of the run imports it at start): SIGUSR1
makes an async env worker write half of a result message to its channel (its header promises all of it), then stop
itself (SIGSTOP): a worker stopped half way through a message, at worst, whatever its env and without changing the
spec's backend."""
import os
import signal
import sys


def _stop_mid_message(signum, frame):
    from topo.launch.async_mode import channels

    while frame is not None and frame.f_code.co_name != "_process_env_loop":  # torchrl's async env worker loop
        frame = frame.f_back
    sender = frame.f_locals["result_queue"]._sender
    os.write(sender._connection.fileno(), channels._HEADER.pack(1 << 20, 0, channels.RESULT) + b"x" * 1000)
    print("stopping half way through a message", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSTOP)


signal.signal(signal.SIGUSR1, _stop_mid_message)
