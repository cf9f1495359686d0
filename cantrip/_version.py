"""The package version, in a module of its own so any layer may read it without
importing the package's public surface (``cantrip/__init__.py``), which imports
every layer."""

__version__ = "0.1.0"

DISTRIBUTION = "cantrip-runtime"
"""The name to ``pip install``: ``cantrip`` on the package index is an unrelated project.
The import name and the command stay ``cantrip``."""
