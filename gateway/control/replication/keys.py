"""The replica channel's CURVE keys: who may publish to and read from a replica.

Every replica's PUB is a CURVE server and every SUB connection a CURVE client, so the
channel is encrypted and both ends prove they hold a trusted key pair:

- this replica's key pair: its secret key (`KVGATE_REPLICA_CURVE_SECRET_KEY`, or the file
  `secret-key` of `KVGATE_REPLICA_CURVE_KEYS_DIR`, a mounted Secret); the public key is
  derived from it. The replicas of one Deployment share one pair from one Secret.
- the trusted public keys: this replica's own, plus `KVGATE_REPLICA_CURVE_PEER_KEYS` (and
  the file `peer-keys` of the directory): the key pairs of other replicas, e.g. the new
  pair during a rotation. A PUB admits a SUB only with a trusted client key (ZAP,
  `guard.py`); a SUB reaches each peer with one connection per trusted server key, of
  which only the right one completes its handshake.

Keys are Z85 text (40 characters), as `kvgate replica-keys` prints them. A secret key is
never printed, logged or shown in an error.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import zmq
from zmq.utils import z85

from gateway.errors import ConfigError

SECRET_VARIABLE = "KVGATE_REPLICA_CURVE_SECRET_KEY"
PEERS_VARIABLE = "KVGATE_REPLICA_CURVE_PEER_KEYS"
DIR_VARIABLE = "KVGATE_REPLICA_CURVE_KEYS_DIR"
SECRET_FILE = "secret-key"
PUBLIC_FILE = "public-key"
PEERS_FILE = "peer-keys"
MAX_TRUSTED_KEYS = 8
"""Trusted public keys at most (each costs one SUB socket per peer address)."""
KEY_HELP = "a Z85 CURVE key: 40 characters (`kvgate replica-keys` makes a pair)"
_Z85 = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")


def z85_key(raw: str) -> str:
    """`raw` if it is a Z85-encoded 32-byte key (ValueError otherwise)."""
    key = raw.strip()
    if not _Z85.fullmatch(key):
        raise ValueError("not a Z85 key")
    try:
        z85.decode(key)
    except (ValueError, OverflowError, struct.error):  # a group over 2**32
        raise ValueError("not a Z85 key") from None
    return key


def z85_keys(raw: str) -> tuple[str, ...]:
    """Public keys separated by commas, spaces or new lines."""
    keys = tuple(z85_key(part) for part in re.split(r"[\s,]+", raw) if part)
    if len(keys) > MAX_TRUSTED_KEYS:
        raise ValueError("too many keys")
    return keys


def new_key_pair() -> tuple[str, str]:
    """(secret, public), Z85."""
    public, secret = zmq.curve_keypair()
    return secret.decode("ascii"), public.decode("ascii")


def public_of(secret: str) -> str:
    return zmq.curve_public(secret.encode("ascii")).decode("ascii")


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """This replica's key pair and the public keys it trusts (its own first)."""

    secret: str
    public: str
    trusted: tuple[str, ...]

    def __repr__(self) -> str:  # never the secret
        return f"CurveKeys(public={self.public!r}, trusted={len(self.trusted)})"

    @classmethod
    def of(cls, secret: str, peers: Iterable[str] = ()) -> CurveKeys:
        public = public_of(secret)
        trusted = tuple(dict.fromkeys([public, *peers]))
        if len(trusted) > MAX_TRUSTED_KEYS:
            raise ConfigError(PEERS_VARIABLE, f"{len(trusted)} keys", f"at most {MAX_TRUSTED_KEYS}")
        return cls(secret, public, trusted)

    def trusts(self, client_key: bytes) -> bool:
        """Whether a client's raw 32-byte public key (as ZAP hands it) is trusted."""
        return z85.encode(client_key).decode("ascii") in self.trusted


def load_keys(
    secret: str | None, peers: tuple[str, ...], directory: Path | None
) -> CurveKeys | None:
    """The keys the settings name (None: none): the variables, or the key directory's
    files (`secret-key`, optional `public-key` checked against it, optional `peer-keys`)."""
    if directory is None:
        return None if secret is None else CurveKeys.of(secret, peers)
    secret = _read_key_file(directory, SECRET_FILE, required=True)
    assert secret is not None
    keys = CurveKeys.of(secret, [*peers, *_peer_file(directory)])
    public = _read_key_file(directory, PUBLIC_FILE, required=False)
    if public is not None and public != keys.public:
        raise ConfigError(f"{DIR_VARIABLE}: {PUBLIC_FILE}", public, "the public key of secret-key")
    return keys


def _read_key_file(directory: Path, name: str, *, required: bool) -> str | None:
    path = directory / name
    where = f"{DIR_VARIABLE}: {path}"
    try:
        raw = path.read_text(encoding="ascii")
    except FileNotFoundError:
        if required:
            raise ConfigError(where, "(missing)", f"a file holding {KEY_HELP}") from None
        return None
    except (OSError, UnicodeDecodeError) as exc:
        allowed = f"a readable file ({type(exc).__name__})"
        raise ConfigError(where, "(unreadable)", allowed) from None
    try:
        return z85_key(raw)
    except ValueError:
        shown = "(hidden)" if name == SECRET_FILE else raw.strip()[:60]
        raise ConfigError(where, shown, KEY_HELP) from None


def _peer_file(directory: Path) -> tuple[str, ...]:
    path = directory / PEERS_FILE
    if not path.exists():
        return ()
    try:
        return z85_keys(path.read_text(encoding="ascii"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise ConfigError(f"{DIR_VARIABLE}: {path}", "(unreadable or invalid)",
                          f"public keys separated by commas or new lines, each {KEY_HELP}, "
                          f"at most {MAX_TRUSTED_KEYS}") from None  # fmt: skip


def local_endpoint(endpoint: str) -> bool:
    """Whether only this host can reach `endpoint`: `ipc://`, `inproc://`, or `tcp://` on a
    loopback address or `localhost` (any other host name counts as reachable: it is not
    resolved here)."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://") :].rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
