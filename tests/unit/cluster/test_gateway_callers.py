"""What a gateway places for a create body (`gateway/callers.py`): a template's memory from
the nodes that hold it, and an image reference (as the template, or under the operator's
metadata key) placed as its normalized reference, preferably where its template was made."""

from __future__ import annotations

import json

from aenv.cluster.gateway.callers import ImageCreates, placement_request
from aenv.cluster.membership import Capacity, NodeRecord
from aenv.cluster.placement import NodeView, PreferLocal, Reservation

IMAGE = "127.0.0.1:5000/tools/py:3"


def _node(name: str, memory_of: dict[str, int]) -> NodeRecord:
    return NodeRecord(name=name, url=f"http://{name}", version="t", memory_of=memory_of,
                      capacity=Capacity(max_sandboxes=10, memory_mib=8192))  # fmt: skip


def _body(**doc: object) -> bytes:
    return json.dumps(doc).encode()


def test_a_template_takes_its_memory_from_the_nodes_that_hold_it() -> None:
    nodes = [_node("a", {"base": 512}), _node("b", {"base": 1024})]
    req = placement_request(_body(templateID="base"), nodes, [])
    assert req is not None and (req.template, req.memory_mib) == ("base", 1024)
    assert placement_request(_body(templateID="nope"), nodes, []) is None  # the node's 404
    assert placement_request(b"{", nodes, []) is None


def test_an_image_is_placed_where_its_template_was_made() -> None:
    made = _node("b", {"base": 512, IMAGE: 768})
    nodes = [_node("a", {"base": 512}), made]
    req = placement_request(_body(templateID=IMAGE), nodes, [], ImageCreates(memory_mib=256))
    assert req is not None and (req.template, req.memory_mib) == (IMAGE, 768)
    views = [NodeView(n, Reservation()) for n in nodes]
    assert PreferLocal().choose(req, views).record.name == "b"  # type: ignore[union-attr]
    # Not made anywhere yet: the default shape's memory, the least loaded node.
    req = placement_request(_body(templateID="127.0.0.1:5000/other"), nodes, [],
                            ImageCreates(memory_mib=256))  # fmt: skip
    assert req is not None and req.memory_mib == 256
    assert req.template == "127.0.0.1:5000/other:latest"
    # A name that is no image, or a broken reference: the node answers (404, 400).
    assert placement_request(_body(templateID="ubuntu:22.04"), nodes, []) is None
    assert placement_request(_body(templateID="127.0.0.1:5000/Bad Ref"), nodes, []) is None


def test_the_metadata_key_names_the_image_and_wins_over_the_template() -> None:
    nodes = [_node("a", {"base": 512}), _node("b", {"base": 512, IMAGE: 768})]
    body = _body(templateID="base", metadata={"image": IMAGE})
    req = placement_request(body, nodes, [], ImageCreates(metadata_key="image"))
    assert req is not None and (req.template, req.memory_mib) == (IMAGE, 768)
    req = placement_request(body, nodes, [])  # no key configured: the metadata is metadata
    assert req is not None and req.template == "base"
