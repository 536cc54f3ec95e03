from __future__ import annotations

import pytest

from tuneplane.app.db import Database
from tuneplane.app.errors import Refusal
from tuneplane.app.security import hash_password, new_token, token_hash, verify_password


def test_token_authenticates_and_revocation_refuses(db: Database) -> None:
    user = db.call("create_user", "alice", hash_password("pw"), "user")[0]
    plaintext, digest = new_token("tpu")
    token = db.call("issue_api_token", user["id"], "cli", digest, None)[0]
    assert db.call("authenticate_api_token", token_hash(plaintext), "api")[0]["username"] == "alice"
    # only the hash is stored
    assert db.fetch_one("SELECT count(*) AS n FROM api_tokens WHERE token_hash = %s", (plaintext,))["n"] == 0
    db.call("revoke_api_token", user["id"], token["id"])
    with pytest.raises(Refusal) as err:
        db.call("authenticate_api_token", digest, "api")
    assert err.value.status == 401 and err.value.field == "token"


def test_duplicate_and_malformed_usernames_are_refused_with_field(db: Database) -> None:
    db.call("create_user", "bob", None, "user")
    with pytest.raises(Refusal) as dup:
        db.call("create_user", "bob", None, "user")
    assert dup.value.status == 409 and dup.value.field == "username"
    with pytest.raises(Refusal) as bad:
        db.call("create_user", "Bad Name!", None, "user")
    assert bad.value.status == 400 and bad.value.field == "username"


def test_first_admin_is_created_once(db: Database) -> None:
    first = db.call("create_first_admin", "admin", None)[0]
    again = db.call("create_first_admin", "admin2", None)[0]
    assert first["role"] == "admin" and again["id"] is None
    assert db.fetch_one("SELECT count(*) AS n FROM users")["n"] == 1


def test_password_hash_round_trip() -> None:
    stored = hash_password("s3cret")
    assert verify_password("s3cret", stored)
    assert not verify_password("wrong", stored)
    assert not verify_password("s3cret", None)
