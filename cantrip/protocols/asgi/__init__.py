"""ASGI primitives: what a request carries, what a response sends, ids, the OpenAPI document."""
