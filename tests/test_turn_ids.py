"""Turn ids (``Loom.new_turn_id``): unique, time-ordered, and made without a call that
releases the GIL on every turn (issue 46.4: ``os.urandom`` per turn cost a worker's loop
~0.1 ms a turn waiting to take the GIL back from its database threads)."""

from __future__ import annotations

import multiprocessing
import os
import re

import pytest

from cantrip.loom import Loom


def test_turn_ids_are_unique_and_shaped() -> None:
    ids = [Loom.new_turn_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"turn-[0-9a-f]{32}", i) for i in ids)
    assert ids[0][:17] <= ids[-1][:17]  # the millisecond clock leads


def test_a_turn_id_takes_no_system_randomness_per_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    def no(n: int) -> bytes:
        raise AssertionError("os.urandom on the turn path")

    monkeypatch.setattr(os, "urandom", no)
    assert Loom.new_turn_id() != Loom.new_turn_id()


def _child_ids(out: multiprocessing.connection.Connection) -> None:
    out.send([Loom.new_turn_id()[17:] for _ in range(1000)])


def test_a_forked_process_makes_other_ids_than_its_parent() -> None:
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child_ids, args=(send,))
    child.start()
    theirs = set(receive.recv())
    child.join()
    ours = {Loom.new_turn_id()[17:] for _ in range(1000)}
    assert not ours & theirs  # the child's generator was seeded afresh
