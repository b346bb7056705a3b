"""Every fingerprint field, changed alone, is a mismatch naming that field:
from a real daemon for the fingerprint this package computes, and from the
package's own diff."""

import dataclasses

import pytest

from weightcache import protocol
from weightcache.checkpoint import resolve
from weightcache.fingerprint import Fingerprint, Request, diff
from test_vectors import VECTORS

FIELDS = [f.name for f in dataclasses.fields(Fingerprint)]


def changed(fp, name):
    fp = dataclasses.replace(fp)
    v = getattr(fp, name)
    setattr(fp, name, v + 1 if isinstance(v, int) else v + "-other")
    return fp


def test_every_field_is_covered():
    # Go's field list, pinned for Python, rather than a count kept by hand.
    assert FIELDS == [f["name"] for f in VECTORS["fingerprint_fields"]]


@pytest.mark.parametrize("name", FIELDS)
def test_mismatch_names_the_field(model, daemon, sock_dir, name):
    daemon(model)
    fp = resolve(model).fingerprint(Request(model=model))
    other = changed(fp, name)
    assert [d["field"] for d in diff(other, fp)] == [name]
    conn = protocol.Conn(protocol.socket_path(sock_dir, "main", "host"), 5)
    try:
        fr = conn.call(protocol.Hello(fingerprint=other.to_wire(), device="host", mode="zero_copy", client="t"),
                       "mismatch", timeout=5)
    finally:
        conn.close()
    assert [f["field"] for f in fr.body["fields"]] == [name], fr.body
