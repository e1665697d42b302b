"""The pure parts of authentication: key format and hashing, scopes, the auth mode."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import pytest

from services.cli.query import api_headers
from services.core.access import Caller
from services.core.api_keys import (
    ApiKey,
    ApiKeyError,
    hash_secret,
    new_key,
    parse_scopes,
    split_key,
)
from services.core.errors import ConfigurationError
from services.core.settings import Settings
from services.query_api.auth import check_bind, docs_enabled, is_loopback, keys_required


def _key(scopes: tuple[str, ...], tenant: str | None = "acme") -> ApiKey:
    now = datetime.now(UTC)
    return ApiKey(7, "ci", "0123456789ab", scopes, tenant, ("eng", "hr"), now, None, None)


def test_new_keys_are_random_and_carry_their_lookup_id() -> None:
    key, lookup, digest = new_key()
    assert key.startswith(f"kgs_{lookup}_")
    assert split_key(key) == (lookup, key[17:])
    assert digest == hashlib.sha256(key[17:].encode()).digest() == hash_secret(key[17:])
    assert len(key[17:]) == 43  # 32 random bytes, URL-safe base64
    others = {new_key()[0] for _ in range(50)}
    assert len(others) == 50
    assert key not in others


@pytest.mark.parametrize(
    "bad",
    ["", "kgs_", "nonsense", "kgs_0123456789ab_short", "KGS_0123456789ab_" + "a" * 43,
     "kgs_0123456789AB_" + "a" * 43, "kgs_0123456789ab_" + "a" * 44, "kgs_0123456789ab_" + "é" * 43,
     "kgs_0123456789ab_" + "a" * 42 + "\x00"],
)  # fmt: skip
def test_malformed_keys_do_not_split(bad: str) -> None:
    assert split_key(bad) is None


def test_scopes_are_validated_and_canonical() -> None:
    assert parse_scopes("ingest, query") == ("query", "ingest")
    assert parse_scopes(["admin"]) == ("admin",)
    with pytest.raises(ApiKeyError, match=r"unknown scope\(s\) \['write'\]"):
        parse_scopes("query,write")
    with pytest.raises(ApiKeyError, match="choose from query, ingest, admin"):
        parse_scopes(" , ")


def test_a_key_becomes_its_caller() -> None:
    reader = _key(("query",))
    assert reader.caller() == Caller("acme", frozenset({"eng", "hr"}), admin=False, key_id=7)
    assert reader.allows("query")
    assert not reader.allows("ingest")
    assert not reader.allows("admin")
    admin = _key(("admin",))
    assert admin.caller() == Caller(admin=True, key_id=7)
    assert all(admin.allows(s) for s in ("query", "ingest", "admin"))
    assert "secret" not in " ".join(admin.to_dict())


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("[::1]", True),
     ("localhost", True), ("LOCALHOST", True), ("0.0.0.0", False), ("::", False),  # noqa: S104
     ("10.0.0.5", False), ("api.example.com", False), ("", False)],
)  # fmt: skip
def test_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("auth", "host", "required", "docs"),
    [("auto", "127.0.0.1", False, True), ("auto", "0.0.0.0", True, False),  # noqa: S104
     ("required", "127.0.0.1", True, False), ("off", "127.0.0.1", False, True)],
)  # fmt: skip
def test_auth_mode(auth: str, host: str, required: bool, docs: bool) -> None:
    settings = Settings(auth=auth, api_host=host)
    assert keys_required(settings) is required
    assert docs_enabled(settings) is docs
    assert docs_enabled(settings.model_copy(update={"api_docs": "on"}))
    assert not docs_enabled(settings.model_copy(update={"api_docs": "off"}))


def test_auth_off_on_a_public_address_needs_forcing() -> None:
    with pytest.raises(ConfigurationError, match="KGSTREAM_AUTH_ALLOW_INSECURE=true"):
        check_bind(Settings(auth="off", api_host="0.0.0.0"))  # noqa: S104
    check_bind(Settings(auth="off", api_host="0.0.0.0", auth_allow_insecure=True))  # noqa: S104
    check_bind(Settings(auth="off", api_host="127.0.0.1"))
    check_bind(Settings(auth="auto", api_host="0.0.0.0"))  # noqa: S104


def test_cli_sends_the_configured_key() -> None:
    assert api_headers(Settings()) == {}
    assert api_headers(Settings(api_key="kgs_x")) == {"Authorization": "Bearer kgs_x"}
