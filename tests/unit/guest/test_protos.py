"""Our .proto files (and the committed stubs) match the SDK's wire contract exactly."""

from __future__ import annotations

import importlib

import pytest

from aenv.guest.gen import filesystem_pb, process_pb


def _shape(desc) -> dict[str, object]:  # type: ignore[no-untyped-def]
    out: dict[str, object] = {}

    def message(m) -> None:  # type: ignore[no-untyped-def]
        out[m.type_name] = sorted(
            (f.number, f.name, f.json_name, str(f.presence), str(f.proto)) for f in m.fields
        )
        for n in m.nested_messages:
            message(n)

    for m in desc.messages:
        message(m)
    for e in desc.enums:
        out[e.type_name] = sorted((v.number, v.name) for v in e.values)
    for s in desc.services:
        out[s.type_name] = sorted((x.name, str(x.method_kind)) for x in s.methods)
    return out


@pytest.mark.parametrize(
    ("ours", "sdk_module"),
    [
        (process_pb, "e2b.envd.process.process_pb"),
        (filesystem_pb, "e2b.envd.filesystem.filesystem_pb"),
    ],
)
def test_descriptors_match_the_sdk(ours, sdk_module: str) -> None:  # type: ignore[no-untyped-def]
    sdk = importlib.import_module(sdk_module)  # the pinned SDK's: missing is a failure
    assert _shape(ours.desc()) == _shape(sdk.desc())
