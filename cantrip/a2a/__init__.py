"""A2A (Agent2Agent): remote agents as a circle's gates (``[[circle.a2a]]``).

The server side (``cantrip serve`` publishing an Agent Card and answering A2A) is
:mod:`cantrip.protocols.a2a._server`; the ``[[circle.a2a]]`` tables of a spec file are read by
:mod:`cantrip.spec._providers`."""

from cantrip.a2a._provider import A2AAgent

__all__ = ["A2AAgent"]
