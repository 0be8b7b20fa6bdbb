"""Checkpoints as data: weights read with ``torch.load(weights_only=True)``, anything else refused, never run.

A checkpoint travels (``evaluate this``), and ``torch.save`` writes pickles, which may name any callable.
:func:`load` unpickles with torch's weights-only unpickler: tensors, containers and the few torch types it
allows, plus a TensorDict (its class and the function its pickle rebuilds it with, found by reducing one:
the state it is given is tensors and plain values). What it refuses (a whole module, a pickle that would
call ``os.system``) is a :class:`~topo.errors.RecordError` naming the file and the callables its pickle names,
read from its opcodes without running any.
"""
from __future__ import annotations

import copyreg
import io
import pickle
import pickletools
import re
import warnings
import zipfile
from typing import Any

from topo.errors import RecordError

HINT = ("save the weights alone: torch.save(policy.state_dict(), path), or a TensorDict: "
        "torch.save(TensorDict.from_module(policy).data, path)")
_NAMED = 8  # callables named in a refusal, at most
_SCAN_BYTES = 64 * 1024 * 1024  # of a pickle read to name its callables (the weights are not in the pickle)


def load(source: str | bytes, name: str | None = None) -> Any:
    """The state dict or TensorDict in ``source`` (a path, or ``torch.save`` bytes; ``name``: what to call it)."""
    import torch
    from tensordict import TensorDict

    name = name or (source if isinstance(source, str) else "the weights")
    reduce = copyreg.dispatch_table.get(TensorDict)  # tensordict registers how a TensorDict pickles
    rebuild = [reduce(TensorDict())[0]] if reduce else []  # the function its pickle names to rebuild it
    try:
        with torch.serialization.safe_globals([TensorDict, *rebuild]), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's note on a pickle protocol it did not write
            return torch.load(io.BytesIO(source) if isinstance(source, bytes) else source, weights_only=True,
                              map_location="cpu")
    except pickle.UnpicklingError as err:
        refused = re.findall(r"GLOBAL ([\w.]+)", str(err))  # what torch's weights-only unpickler refused
        if not refused:
            named = _callables(source)
            what = f"a pickle that names {named}" if named else "its pickle does not read as weights"
            raise RecordError(name, f"not a checkpoint torch.save wrote ({what})", hint=HINT) from None
        raise RecordError(name, f"a checkpoint that holds more than weights: its pickle calls {refused[0]} (it "
                          f"names {_callables(source) or refused[0]}); topo loads state dicts and TensorDicts only, and never runs a "
                          "file's code", hint=HINT) from None
    except (RuntimeError, EOFError, ValueError, OSError) as err:  # not a torch.save file
        raise RecordError(name, f"not a checkpoint torch.save wrote ({str(err).splitlines()[0][:200]})",
                          hint=HINT) from None


def _callables(source: str | bytes) -> str:
    """The globals a checkpoint's pickle names (``module.name``), read from its opcodes, none run."""
    data = _pickle_bytes(source)
    names: list[str] = []
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings = (strings + [arg])[-2:]
            elif op.name in ("GLOBAL", "INST"):
                names.append(arg.replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) == 2:
                names.append(".".join(strings))
    except Exception:  # noqa: BLE001 - a malformed pickle: what was named before it broke
        pass
    named = sorted(set(names))
    if not named:
        return ""
    more = f" and {len(named) - _NAMED} more" if len(named) > _NAMED else ""
    return ", ".join(named[:_NAMED]) + more


def _pickle_bytes(source: str | bytes) -> bytes:
    """The pickle of a ``torch.save`` file (its zip's ``data.pkl``, or the whole of a legacy one), bounded."""
    stream = io.BytesIO(source) if isinstance(source, bytes) else open(source, "rb")
    with stream:
        try:
            with zipfile.ZipFile(stream) as archive:
                member = next((m for m in archive.namelist() if m.endswith("data.pkl")), None)
                if member is None:
                    return b""
                with archive.open(member) as f:
                    return f.read(_SCAN_BYTES)
        except zipfile.BadZipFile:
            stream.seek(0)
            return stream.read(_SCAN_BYTES)


def into(policy: Any, source: str | bytes) -> None:
    """Load the checkpoint ``source`` (:func:`load`) into ``policy``; one that does not fit it is refused, named."""
    import torch
    from tensordict import TensorDict, TensorDictBase

    name = source if isinstance(source, str) else "the weights"
    weights = load(source, name)
    try:
        if isinstance(weights, TensorDictBase):
            with torch.no_grad():
                TensorDict.from_module(policy).data.update_(weights)
        elif isinstance(weights, dict):
            policy.load_state_dict(weights)
        else:
            raise RecordError(name, f"a checkpoint of a {type(weights).__name__}, not a state dict or a TensorDict",
                              hint=HINT)
    except (RuntimeError, KeyError, TypeError, ValueError) as err:
        raise RecordError(name, f"its weights do not fit the policy: {str(err).strip()[:500]}", hint=HINT) from None
