"""The reads both SQL memory stores share: listing namespaces and searching.

SQLite and PostgreSQL differ in their dialect (the placeholder, the table names, how
text is ranked, how a vector distance is computed) and in how a statement runs (one
connection behind a lock, or a pool). The rules of a read -- the argument checks,
newest first without a query, the search modes and how their rankings are fused --
are the same, so they are written once here and each store supplies only its
dialect; a fix to one store's search cannot miss the other's.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from cantrip.llm._embed_contract import Embedder
from cantrip.memory._model import (
    Namespace,
    SearchItem,
    check_listing,
    check_namespace,
    check_search,
    list_namespaces_from,
    under,
)
from cantrip.memory._vectors import SearchMode, ranked, resolve_mode

COLUMNS = "i.namespace, i.key, i.value, i.metadata, i.revision, i.created_at, i.updated_at"
"""An item's columns, in the order a store's ``_search_item`` reads them."""


class NearestVectors(Protocol):
    """What a search needs of a store's vectors."""

    embedder: Embedder | None

    def query_vector(self, query: str) -> Any | None: ...

    def nearest_sql(self, columns: str, where: str) -> str: ...


class SqlReads:
    """``list_namespaces`` and ``search`` over a store's SQL dialect."""

    MARK: ClassVar[str]
    """The driver's parameter placeholder."""
    ITEMS: ClassVar[str]
    """The items table (aliased ``i`` in every query)."""
    vectors: NearestVectors

    def _fetch(self, sql: str, params: list[Any]) -> list[Any]:
        """Run one read statement and return its rows."""
        raise NotImplementedError

    def _search_item(self, row: Any) -> SearchItem:
        """One row of :data:`COLUMNS` plus a score as a search hit."""
        raise NotImplementedError

    def _text_sql(self, words: list[str], where: str) -> tuple[str, list[Any]]:
        """The ranked full-text query (parameters after the returned ones: ``where``'s,
        limit, offset) and its leading parameters."""
        raise NotImplementedError

    def list_namespaces(
        self,
        prefix: Namespace = (),
        *,
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Namespace]:
        check_listing(max_depth, limit, offset)
        where, params = under(check_namespace(prefix, prefix=True), self.MARK)
        rows = self._fetch(f"SELECT DISTINCT i.namespace FROM {self.ITEMS} i WHERE {where}", params)
        return list_namespaces_from([row[0] for row in rows], max_depth, limit, offset)

    def search(
        self,
        prefix: Namespace = (),
        *,
        query: str | None = None,
        limit: int = 10,
        offset: int = 0,
        mode: SearchMode | None = None,
    ) -> list[SearchItem]:
        words = check_search(query, limit, offset)
        chosen = resolve_mode(mode, self.vectors.embedder)
        where, params = under(check_namespace(prefix, prefix=True), self.MARK)
        if words is None or query is None:
            sql = (
                f"SELECT {COLUMNS}, NULL FROM {self.ITEMS} i WHERE {where} "
                f"ORDER BY i.updated_at DESC, i.namespace, i.key LIMIT {self.MARK} "
                f"OFFSET {self.MARK}"
            )
            return self._rows(sql, [*params, limit, offset])
        return ranked(
            chosen,
            lambda n, skip: self._text(words, where, params, n, skip),
            lambda n, skip: self._semantic(query, where, params, n, skip),
            limit,
            offset,
        )

    def _text(
        self, words: list[str], where: str, params: list[Any], limit: int, offset: int
    ) -> list[SearchItem]:
        if not words:
            return []  # nothing searchable in the query (only punctuation): nothing matches
        sql, leading = self._text_sql(words, where)
        return self._rows(sql, [*leading, *params, limit, offset])

    def _semantic(
        self, query: str, where: str, params: list[Any], limit: int, offset: int
    ) -> list[SearchItem]:
        vector = self.vectors.query_vector(query)
        if vector is None:
            return []
        sql = self.vectors.nearest_sql(COLUMNS, where)
        return self._rows(sql, [vector, *params, limit, offset])

    def _rows(self, sql: str, params: list[Any]) -> list[SearchItem]:
        return [self._search_item(row) for row in self._fetch(sql, params)]
