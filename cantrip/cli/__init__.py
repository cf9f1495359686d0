"""The command line: ``cantrip cast|invoke|acp|serve|mcp|worker|answer|loom|conformance``.

One room for every front end a terminal reaches: :mod:`._main` is the process around
a command (parse, guard, dispatch), :mod:`._parser` the grammar of every command,
:mod:`._exit` the exit codes and the one line a mistake becomes, :mod:`._spec_file`
loading (and ``--check``-ing) a spec's cantrip; each command runs in its own module --
:mod:`._cast` (``cast``, ``invoke``), :mod:`._protocols` (``serve``, ``acp``),
:mod:`._worker` (``worker``, ``cast --db``, ``answer --db``), :mod:`._loom` (reading
and exporting looms), :mod:`._mcp` (``mcp``), :mod:`._eval`, :mod:`._init`,
:mod:`._conformance` -- and
:mod:`._serve` is the signal/drain loop both HTTP servers share. Nothing below the
command line imports this package.
"""

from cantrip.cli._main import main

__all__ = ["main"]
