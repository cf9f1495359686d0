"""The command line: ``cantrip cast|invoke|acp|serve|mcp|worker|answer|loom|conformance``.

One room for every front end a terminal reaches: :mod:`._main` parses the command and
runs the spec-file commands, :mod:`._loom` reads and exports looms, :mod:`._worker` holds
``worker``, ``cast --db`` and ``answer --db``, :mod:`._mcp` holds ``mcp``, and
:mod:`._serve` is the signal/drain loop both HTTP servers share. Nothing below the
command line imports this package.
"""

from cantrip.cli._main import main

__all__ = ["main"]
