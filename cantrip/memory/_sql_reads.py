"""What both SQL memory stores share: their reads (getting an item, listing
namespaces, searching), a put's re-planning, the schema-version check.

SQLite and PostgreSQL differ in their dialect (the placeholder, the table names, how
text is ranked, how a vector distance is computed), in how a statement runs (one
connection behind a lock, or a pool) and in how a put writes. The rules of a read --
the argument checks, newest first without a query, the search modes and how their
rankings are fused -- are the same, so they are written once here and each store
supplies only its dialect; a fix to one store's search cannot miss the other's.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar, Protocol

from cantrip.llm._embed_contract import Embedder
from cantrip.memory._model import (
    Item,
    MemoryStoreError,
    Namespace,
    PreparedPut,
    SearchItem,
    check_key,
    check_listing,
    check_namespace,
    check_revision,
    check_search,
    decode_json,
    list_namespaces_from,
    prepare_put,
    split_namespace,
    under,
)
from cantrip.memory._vectors import Plan, SearchMode, Stale, ranked, resolve_mode

COLUMNS = "i.namespace, i.key, i.value, i.metadata, i.revision, i.created_at, i.updated_at"
"""An item's columns, in the order a store's ``_search_item`` reads them."""


def schema_is_current(row: Any, known: int, place: str) -> bool:
    """Whether the memory schema recorded in a database (``row``: its
    ``max(version)``'s row) is ``known``, the version this cantrip writes; False for
    an older one (or none), which the caller migrates. A newer one is refused
    (``place`` names the database: "at URL", "in PATH"): a cantrip must not write
    tables in a shape it does not expect."""
    version = row[0] if row is not None and row[0] is not None else 0
    if version > known:
        raise MemoryStoreError(
            f"the memory tables {place} were written by a newer cantrip "
            f"(memory schema {version}; this one knows up to {known}): upgrade"
        )
    return bool(version == known)


def row_item(row: Any, when: Callable[[Any], datetime]) -> Item:
    """An item from a row of :data:`COLUMNS` (``when``: a stored time as a datetime)."""
    ns, key, value, metadata, revision, created, updated = row
    return Item(
        namespace=split_namespace(ns),
        key=key,
        value=decode_json(value),
        metadata=decode_json(metadata),
        revision=revision,
        created_at=when(created),
        updated_at=when(updated),
    )


class NearestVectors(Protocol):
    """What the shared code needs of a store's vectors."""

    embedder: Embedder | None

    def query_vector(self, query: str) -> Any | None: ...

    def nearest_sql(self, columns: str, where: str) -> str: ...

    def plan(self, item_key: tuple[str, str], text: str, force: bool = False) -> Plan: ...

    def reindex(self) -> int: ...


class SqlReads:
    """``get``, ``list_namespaces``, ``search``, ``put`` and ``reindex`` over a
    store's SQL dialect; the store writes (:meth:`_put`) and runs statements."""

    MARK: ClassVar[str]
    """The driver's parameter placeholder."""
    ITEMS: ClassVar[str]
    """The items table (aliased ``i`` in every query)."""
    REVISIONS: ClassVar[str]
    """The revisions table (aliased ``r``)."""
    vectors: NearestVectors

    def _fetch(self, sql: str, params: list[Any]) -> list[Any]:
        """Run one read statement and return its rows."""
        raise NotImplementedError

    def _item(self, row: Any) -> Item:
        """One row of :data:`COLUMNS` as an item."""
        raise NotImplementedError

    def _put(self, prepared: PreparedPut, plan: Plan) -> Item:
        """Write one put in one transaction; :class:`~cantrip.memory._vectors.Stale`
        when the item's text changed since ``plan`` kept its vector."""
        raise NotImplementedError

    @property
    def embedder(self) -> Embedder | None:
        """The embedder this store was opened with (None: text search only)."""
        return self.vectors.embedder

    def reindex(self) -> int:
        """Embed every item that has no vector yet (put without an embedder); how many."""
        return self.vectors.reindex()

    def put(
        self, namespace: Namespace, key: str, value: Any, metadata: dict[str, Any] | None = None
    ) -> Item:
        prepared = prepare_put(namespace, key, value, metadata)
        item_key = (prepared.namespace, prepared.key)
        plan = self.vectors.plan(item_key, prepared.text)
        while True:
            try:
                return self._put(prepared, plan)
            except Stale:  # the text changed since the plan kept its vector
                plan = self.vectors.plan(item_key, prepared.text, force=True)

    def get(self, namespace: Namespace, key: str, revision: int | None = None) -> Item | None:
        ns, key = check_namespace(namespace), check_key(key)
        check_revision(revision)
        mark = self.MARK
        if revision is None:
            rows = self._fetch(
                f"SELECT {COLUMNS} FROM {self.ITEMS} i WHERE namespace = {mark} AND key = {mark}",
                [ns, key],
            )
        else:
            rows = self._fetch(
                "SELECT r.namespace, r.key, r.value, r.metadata, r.revision, i.created_at, "
                f"r.updated_at FROM {self.REVISIONS} r JOIN {self.ITEMS} i "
                "ON i.namespace = r.namespace AND i.key = r.key "
                f"WHERE r.namespace = {mark} AND r.key = {mark} AND r.revision = {mark}",
                [ns, key, revision],
            )
        return self._item(rows[0]) if rows else None

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
