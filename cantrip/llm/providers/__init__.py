"""Provider adapters, one module each, imported only when a provider is used.

Use :func:`cantrip.llm.load_llm` (or ``[llm] provider = "..."`` in a spec
file) rather than importing these modules: it reads the provider's TOML in
this folder (plus user overrides), checks the key variable, and constructs
the adapter. Importing this package imports nothing else.
"""
