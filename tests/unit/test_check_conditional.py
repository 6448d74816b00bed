"""``wavepipe check``'s proof of a store's conditional writes: what it says of a store whose
writes ignore their conditions (pure: an in-memory store)."""

from __future__ import annotations

import itertools

import pytest

from wavepipe.checks import _conditional_writes


class _Store:
    """Objects in a dict; ``honours`` which conditions it keeps ("create", "replace")."""

    def __init__(self, honours: set[str]):
        self.honours, self.objects, self._versions = honours, {}, itertools.count(1)

    def put_if(self, key: str, data: bytes, tag: str | None = None) -> str | None:
        current = self.objects.get(key)
        if tag is None and current is not None and "create" in self.honours:
            return None
        if tag is not None and (current is None or current[1] != tag) and "replace" in self.honours:
            return None
        self.objects[key] = (data, f'"{next(self._versions)}"')
        return self.objects[key][1]


@pytest.mark.parametrize(
    ("honours", "said"),
    [
        ({"create", "replace"}, None),
        ({"replace"}, "a second create of one object was allowed"),
        ({"create"}, "a replace of a stale version was allowed"),
    ],
)
def test_a_store_that_ignores_a_condition_is_named_for_it(honours, said):
    found = _conditional_writes(_Store(honours), "k", b"body")
    assert found == said or (said and said in found), found
