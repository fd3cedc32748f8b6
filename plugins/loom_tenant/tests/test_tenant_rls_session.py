"""How a connection is told its tenant for row-level security (no SQL is built)."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from loom_tenant.rls import session_options, session_url

from loom_core import InvalidOptionError, InvalidURLError


def test_session_options_set_the_tenant_and_the_role() -> None:
    assert session_options("acme") == "-c loom.tenant=acme"
    assert session_options("acme", role="loom_app") == "-c loom.tenant=acme -c role=loom_app"


def test_spaces_and_backslashes_in_a_tenant_are_escaped_for_libpq() -> None:
    assert session_options("a b\\c") == "-c loom.tenant=a\\ b\\\\c"


def test_session_url_percent_encodes_and_keeps_existing_options() -> None:
    url = session_url("postgresql://app@db/loom?sslmode=require&options=-c%20x.y%3D1", "a b")
    query = parse_qs(urlsplit(url).query)
    assert query["sslmode"] == ["require"]
    assert query["options"] == ["-c x.y=1 -c loom.tenant=a\\ b"]
    assert "+" not in url, "libpq reads '+' literally"


@pytest.mark.parametrize("tenant", ["a\x00b", "x" * 200])
def test_a_tenant_the_decorator_refuses_is_refused_here_too(tenant: str) -> None:
    with pytest.raises(InvalidOptionError):
        session_options(tenant)


def test_a_bad_role_or_url_is_refused() -> None:
    with pytest.raises(InvalidOptionError, match="role"):
        session_options("acme", role="")
    with pytest.raises(InvalidURLError):
        session_url("not a url", "acme")
