"""Things named in more than one place are named once: each list below is derived from, or
held to, its one source."""

from dataclasses import fields

from attnserve.client.codec import LogitAttribution
from attnserve.model.artifacts import ATTRIBUTION_PARTS
from attnserve.service.core.backend import Attribution
from attnserve.v1.wire import ATTRIBUTION_PARTS as PROTO_PARTS


def test_attributions_parts_are_named_once():
    """The parts of a logit: the .proto's LogitAttribution, the backend's Attribution and the
    client's LogitAttribution name model/artifacts.py's ATTRIBUTION_PARTS, in its order (the
    graph's outputs and the V2 outputs are made from it)."""
    assert PROTO_PARTS == ATTRIBUTION_PARTS
    assert tuple(f.name for f in fields(Attribution)) == ATTRIBUTION_PARTS
    client = tuple(f.name for f in fields(LogitAttribution))
    assert client[-len(ATTRIBUTION_PARTS) :] == ATTRIBUTION_PARTS
