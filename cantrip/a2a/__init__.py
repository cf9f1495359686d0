"""A2A (Agent2Agent): remote agents as a circle's gates (``[[circle.a2a]]``).

The server side (``cantrip serve`` publishing an Agent Card and answering A2A) is
:mod:`cantrip.protocols._a2a`."""

from cantrip.a2a._spec import A2AAgent

__all__ = ["A2AAgent"]
