"""Who may join a Ray cluster: whether it refuses a client without its token (Ray's token authentication,
``RAY_AUTH_MODE=token`` on every node), asked with one gRPC call that carries none and waits at most ``timeout``
seconds. Imports neither ray nor torch: grpc only (ray depends on it).
"""
from __future__ import annotations

import os

PROBE_TIMEOUT_S = 5.0
RUNBOOK = "docs/guides/ray.md#who-may-join"
TOKEN_HINT = ("set RAY_AUTH_MODE=token and the cluster's token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) "
              f"in this process's environment: {RUNBOOK}")
#: a call every client makes first, as bytes: the GCS's cluster id (host:port), the Ray Client server's ping (ray://)
GCS_CALL = ("/ray.rpc.NodeInfoGcsService/GetClusterId", b"")  # an empty GetClusterIdRequest
CLIENT_CALL = ("/ray.rpc.RayletDriver/ClusterInfo", b"\x08\x06")  # ClusterInfoRequest(type=PING)


def token_required(address: str, timeout: float = PROBE_TIMEOUT_S) -> bool | None:
    """True: the cluster at ``address`` (``host:port`` or ``ray://host:port``) refused a call without its token;
    False: it answered one; None: not known (``auto``, grpc missing, no answer in time, or another error)."""
    target = address.removeprefix("ray://")
    host, _, port = target.rpartition(":")
    if not (host and port.isdigit()):
        return None
    try:
        import grpc
    except ImportError:
        return None
    method, request = CLIENT_CALL if address.startswith("ray://") else GCS_CALL
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method, request_serializer=_same, response_deserializer=_same)
        try:
            call(request, timeout=timeout)
        except grpc.RpcError as err:
            return True if err.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return False


def sends_token() -> bool:
    """Whether Ray in this process sends a token to a ``host:port`` or ``ray://`` address: only with RAY_AUTH_MODE=token
    (Ray turns token mode on by itself only for ``auto``, when it finds a token)."""
    return os.environ.get("RAY_AUTH_MODE", "").lower() == "token"


def _same(data: bytes) -> bytes:
    return data
