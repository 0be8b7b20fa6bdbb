"""Who may join a Ray cluster, without one: the probe against a stand-in gRPC server that refuses or answers a call
without a token, as Ray's GCS and Ray Client server do, and what a launch or the doctor says about it."""
from __future__ import annotations

import contextlib
import socket
import time
from concurrent import futures
from typing import Iterator

import pytest

grpc = pytest.importorskip("grpc")

from topo.errors import LaunchError  # noqa: E402
from topo.launch.ray import auth, engine  # noqa: E402
from tests.ray.ray_head_helpers import free_port  # noqa: E402


@contextlib.contextmanager
def stand_in(token: str | None) -> Iterator[tuple[str, list]]:
    """A gRPC server on 127.0.0.1 for the probe's two calls: with ``token``, one without it is UNAUTHENTICATED (Ray's
    answer); without, every call is answered. Yields its address and the (method, request) pairs it received."""
    calls = []

    def handler(method: str):
        def answer(request: bytes, context) -> bytes:
            calls.append((method, request))
            if token and ("authorization", f"Bearer {token}") not in context.invocation_metadata():
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "InvalidAuthToken: Authentication token is missing")
            return b""
        return grpc.unary_unary_rpc_method_handler(answer, request_deserializer=None, response_serializer=None)

    handlers = [grpc.method_handlers_generic_handler(service, {name: handler(f"/{service}/{name}")})
                for service, name in (("ray.rpc.NodeInfoGcsService", "GetClusterId"), ("ray.rpc.RayletDriver", "ClusterInfo"))]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), handlers=handlers)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", calls
    finally:
        server.stop(None)


def test_a_cluster_that_refuses_a_call_without_its_token_requires_one():
    with stand_in(token="s3cret") as (address, calls):
        assert auth.token_required(address) is True
        assert auth.token_required(f"ray://{address}") is True
    assert calls == [auth.GCS_CALL, auth.CLIENT_CALL]  # GetClusterId (empty), ClusterInfo(type=PING)


def test_a_cluster_that_answers_a_call_without_a_token_requires_none():
    with stand_in(token=None) as (address, _):
        assert auth.token_required(address) is False
        assert auth.token_required(f"ray://{address}") is False


def test_what_cannot_be_asked_is_unknown_within_the_timeout():
    assert auth.token_required("auto") is None and auth.token_required("ray://head") is None  # no port to ask
    assert auth.token_required(f"127.0.0.1:{free_port()}") is None  # nothing listens
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts the connection, never answers
        start = time.monotonic()
        assert auth.token_required(f"127.0.0.1:{silent.getsockname()[1]}", timeout=0.5) is None
        assert time.monotonic() - start < 5


def test_a_launch_without_the_token_is_refused_before_ray_retries(monkeypatch):
    with stand_in(token="s3cret") as (address, _):
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        with pytest.raises(LaunchError, match=f"the Ray cluster at {address} refuses a client without its token, "
                                              "and this process sends none: set RAY_AUTH_MODE=token"):
            engine.check_reachable({"address": address})
        monkeypatch.setenv("RAY_AUTH_MODE", "token")  # Ray sends its token: ray.init finds out whether it is right
        engine.check_reachable({"address": address})
    with stand_in(token=None) as (address, _):
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        engine.check_reachable({"address": address})


def test_a_failed_connect_names_the_token_only_when_the_cluster_wants_one():
    err = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379.")
    with stand_in(token="s3cret") as (address, _):
        refused = str(engine.cannot_connect(address, err))
    assert refused == (f"cannot connect to the Ray cluster at '{address}': Failed to connect to Ray cluster at "
                       "10.0.0.1:6379; it refuses a client without its token: set RAY_AUTH_MODE=token and the "
                       "cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) in this process's "
                       "environment: docs/guides/ray.md#who-may-join")
    with stand_in(token=None) as (address, _):
        assert str(engine.cannot_connect(address, err)).endswith(f"10.0.0.1:6379; {engine.HINT}")
