"""Optional CurveZMQ security: key files, CURVE socket options and the ZAP allow-list.

With security on, every link is encrypted and authenticated with CurveZMQ, and a process
that binds (the learner, a proxy) admits only clients whose public key it knows.

The key scheme
--------------
All key files live in one directory, ``keys_dir``; ``zmqrl keygen DIR --name NAME`` writes
a pair of them (the format of ``zmq.auth.create_certificates``):

* ``NAME.key``        -- the public key; safe to copy anywhere.
* ``NAME.key_secret`` -- public and secret key, mode 0600; never leaves its hosts.

A process uses:

1. the **server pair** ``server_key`` (default ``server``): every socket that *binds* is a
   CURVE server with this pair.  The learner and the proxies share it: they are all servers
   to someone, and clients need only one server public key (``server.key``) to trust.
2. a **client pair** ``client_key`` for every socket that *connects*.  Empty (the default)
   means "the server pair": a small cluster can copy the whole key directory to every host
   and be done.  Give hosts their own pair (``zmqrl keygen DIR --name host7 --client``) to
   keep the server secret on the learner and proxy hosts only and to revoke a host by
   deleting its public key from the allow-list.
3. the **allow-list** ``allowed_clients_dir`` (default ``keys_dir/clients``): the public
   keys (``*.key``) a server admits.  The server's own public key is always admitted,
   since whoever holds the server secret could impersonate the server anyway.

So the files each process needs are: ``server.key`` always; ``server.key_secret`` to bind
(and to connect when ``client_key`` is empty); ``CLIENT.key_secret`` to connect when
``client_key`` is set; ``clients/*.key`` to bind.  Keys and the allow-list are read once,
when a :class:`Security` is built; restart a server to change its allow-list.

What is enforced where
----------------------
:func:`apply_curve` sets the CURVE options on a socket before bind/connect; a binding
socket also gets ``ZAP_DOMAIN`` and ``ZAP_ENFORCE_DOMAIN``, so without a ZAP handler it
refuses everyone instead of admitting every key.  The handler is a
:class:`CurveAuthenticator` thread, started by :class:`SecureContext` for the first server
socket made on it.  Clients with an unknown key are refused during the handshake (counted
and logged, rate-limited, with their address); plaintext clients fail the handshake before
the ZAP stage (libzmq drops them; not counted here: the socket's
:class:`~zmqrl.wire.monitor.LinkMonitor`, where it has one, counts them as protocol failures).
A refused client never reaches the application and does not disturb the server's other peers.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from .tracking import RateLimitedLog

log = logging.getLogger("zmqrl.security")

ZAP_DOMAIN = "zmqrl"
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
CLIENTS_DIR = "clients"
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class SecurityError(ValueError):
    """Missing or bad key material; the message names the file and the setting to fix."""


def has_curve() -> bool:
    """True when libzmq was built with CURVE support (libsodium or tweetnacl)."""
    return bool(zmq.has("curve"))


def check_key_name(name: str, setting: str = "name") -> str:
    """``name`` if it is a plain key name (letters, digits, ``_.-``; no path), else SecurityError."""
    if not _NAME.match(name or ""):
        raise SecurityError(f"{setting}: {name!r} is not a key name (use letters, digits, '_', '.', '-'; "
                            f"no directories: the key files live in the keys directory)")
    return name


def _valid_key(text: bytes) -> bool:
    try:
        return len(text) == 40 and len(z85.decode(text)) == 32
    except (ValueError, KeyError, TypeError):
        return False


def read_key_file(path: Path, *, need_secret: bool, what: str, setting: str) -> tuple[bytes, bytes | None]:
    """``(public, secret)`` z85 keys from a key file; SecurityError naming ``path`` and ``setting``.

    A secret key file must hold a secret key matching its public key; one readable by group
    or others is used, with a warning.
    """
    if not path.is_file():
        raise SecurityError(f"{what} file {str(path)!r} not found (check {setting})")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"{what} file {str(path)!r} is not a CURVE key file: {exc} (check {setting})") from None
    if not _valid_key(public) or (secret is not None and not _valid_key(secret)):
        raise SecurityError(f"{what} file {str(path)!r} holds a malformed key (check {setting})")
    if need_secret:
        if secret is None:
            raise SecurityError(f"{what} file {str(path)!r} holds no secret key (check {setting})")
        if zmq.curve_public(secret) != public:
            raise SecurityError(f"{what} file {str(path)!r}: its public key does not match its secret key")
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("secret key file %s has mode %04o; it should be 0600 (chmod 600 %s)", path, mode, path)
    return public, secret


def load_allowed_keys(directory: Path, setting: str) -> frozenset[bytes]:
    """The public keys (z85) of every ``*.key`` file in ``directory``."""
    keys = set()
    for path in sorted(directory.glob(f"*{PUBLIC_SUFFIX}")):
        public, _ = read_key_file(path, need_secret=False, what="allowed client key", setting=setting)
        keys.add(public)
    return frozenset(keys)


@dataclass(frozen=True)
class Security:
    """CURVE key material of one process, read from disk once (see the module docstring).

    Keys are z85-encoded bytes.  Secret keys are left out of ``repr``.
    """

    server_public: bytes  # the server pair's public key: what clients expect to talk to
    server_secret: bytes | None = field(repr=False)  # None where this host holds no server secret
    public: bytes  # this process's client pair
    secret: bytes = field(repr=False)
    allowed: frozenset[bytes] = field(repr=False)  # client public keys servers admit
    server_secret_file: str = ""  # where the server secret was looked for (for messages)
    allowed_dir: str = ""  # where the allow-list came from (for messages)
    label: str = ""  # how the settings are named in messages, e.g. "net."
    domain: str = ZAP_DOMAIN

    @classmethod
    def curve(cls, keys_dir: str, server_key: str = "server", client_key: str = "",
              allowed_clients_dir: str = "", *, label: str = "") -> Security:
        """Read the key files of the scheme in the module docstring.

        ``label`` prefixes setting names in error messages (``"net."`` gives ``net.keys_dir``).
        Raises :class:`SecurityError` naming the missing or bad file and the setting to fix.
        """
        if not has_curve():
            raise SecurityError("this pyzmq/libzmq has no CURVE support (it needs libsodium); "
                                f"set {label}security to none or install a pyzmq built with it")
        if not keys_dir:
            raise SecurityError(f"{label}keys_dir is empty: CURVE security needs the directory of key files "
                                "(make one with `zmqrl keygen DIR --name server`)")
        root = Path(keys_dir).expanduser()
        if not root.is_dir():
            raise SecurityError(f"{label}keys_dir: key directory {str(root)!r} not found "
                                "(make one with `zmqrl keygen DIR --name server`)")
        check_key_name(server_key, f"{label}server_key")
        if client_key:
            check_key_name(client_key, f"{label}client_key")
        where = f"{label}keys_dir={keys_dir!r}, {label}server_key={server_key!r}"
        server_public, _ = read_key_file(root / f"{server_key}{PUBLIC_SUFFIX}", need_secret=False,
                                         what="server public key", setting=where)
        secret_path = root / f"{server_key}{SECRET_SUFFIX}"
        server_secret: bytes | None = None
        if secret_path.exists() or not client_key:
            pub, server_secret = read_key_file(secret_path, need_secret=True, what="server secret key",
                                               setting=where if client_key else
                                               f"{where}; or set {label}client_key to this host's own key pair")
            if pub != server_public:
                raise SecurityError(f"{str(secret_path)!r} and {str(root / (server_key + PUBLIC_SUFFIX))!r} are not "
                                    f"one key pair (regenerate both with `zmqrl keygen {keys_dir} --name "
                                    f"{server_key} --force` and copy them again)")
        if client_key:
            public, secret = read_key_file(root / f"{client_key}{SECRET_SUFFIX}", need_secret=True,
                                           what="client secret key",
                                           setting=f"{label}keys_dir={keys_dir!r}, {label}client_key={client_key!r}")
        else:
            public, secret = server_public, server_secret
        assert secret is not None
        if allowed_clients_dir:
            allowed_root = Path(allowed_clients_dir).expanduser()
            if not allowed_root.is_dir():
                raise SecurityError(f"{label}allowed_clients_dir: directory {str(allowed_root)!r} not found")
        else:
            allowed_root = root / CLIENTS_DIR
        allowed_setting = f"{label}allowed_clients_dir (default {label}keys_dir/{CLIENTS_DIR})"
        allowed = load_allowed_keys(allowed_root, allowed_setting) if allowed_root.is_dir() else frozenset()
        return cls(server_public=server_public, server_secret=server_secret, public=public, secret=secret,
                   allowed=allowed | {server_public}, server_secret_file=str(secret_path),
                   allowed_dir=str(allowed_root), label=label)

    def missing_server_secret(self) -> str:
        """Why this process cannot bind a CURVE server socket ('' when it can)."""
        if self.server_secret is not None:
            return ""
        return (f"the server secret key file {self.server_secret_file!r} is missing; a socket that binds needs "
                f"the server key pair ({self.label}keys_dir, {self.label}server_key)")


def apply_curve(sock: zmq.Socket, security: Security, *, server: bool) -> None:
    """Set the CURVE options of ``sock`` (call before bind/connect).

    A server gets the server pair, ``ZAP_DOMAIN`` and, where libzmq has it,
    ``ZAP_ENFORCE_DOMAIN`` (no ZAP handler means no admission).  A client gets its own
    pair and the server's public key.
    """
    if server:
        why = security.missing_server_secret()
        if why:
            raise SecurityError(why)
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, security.server_public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, security.server_secret)  # type: ignore[arg-type]
        sock.setsockopt(zmq.ZAP_DOMAIN, security.domain.encode())
        enforce = getattr(zmq, "ZAP_ENFORCE_DOMAIN", None)
        if enforce is not None:
            try:
                sock.setsockopt(enforce, 1)
            except zmq.ZMQError:  # libzmq without the draft option: the SecureContext check still holds
                pass
    else:
        sock.setsockopt(zmq.CURVE_SERVERKEY, security.server_public)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, security.public)
        sock.setsockopt(zmq.CURVE_SECRETKEY, security.secret)


class AllowList:
    """ZAP credentials provider: admits the keys of a :class:`Security`, counts and logs refusals.

    Every refusal is counted; one line per ``log_interval_s`` tells of them, naming the latest client's
    address and key and how many were left out since the line before. (One line per key would let a
    client that makes up a new key for each connection write a line each, and keep a key each.)
    """

    def __init__(self, security: Security, log_interval_s: float = 30.0) -> None:
        self.security = security
        self.allowed = 0
        self.refused = 0
        self.address = ""  # peer address of the request being checked (set by the authenticator)
        self._ratelog = RateLimitedLog(log, interval=log_interval_s)
        self._lock = threading.Lock()

    def callback(self, domain: str, key: bytes) -> bool:
        """Called by the authenticator with the client's z85 public key."""
        ok = domain == self.security.domain and key in self.security.allowed
        with self._lock:
            if ok:
                self.allowed += 1
                return True
            self.refused += 1
            refused = self.refused
        self._ratelog.warn("refused", f"refused CURVE client {self.address or '(unknown address)'} with key "
                                      f"{key.decode('ascii', 'replace')}: not in the allow-list "
                                      f"{self.security.allowed_dir} ({refused} refused so far)")
        return False

    def counts(self) -> dict[str, int]:
        """``{"curve_allowed": n, "curve_refused": m}`` (handshakes so far)."""
        with self._lock:
            return {"curve_allowed": self.allowed, "curve_refused": self.refused}


class CurveAuthenticator(ThreadAuthenticator):
    """pyzmq's ZAP thread, admitting exactly the keys of an :class:`AllowList`."""

    def __init__(self, context: zmq.Context, allow_list: AllowList) -> None:
        super().__init__(context=context, log=logging.getLogger("zmqrl.security.zap"))
        self.allow_list = allow_list

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        """Remember the peer address for the refusal log, then authenticate as pyzmq does."""
        self.allow_list.address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else ""
        await super().handle_zap_message(msg)

    def start_curve(self) -> None:
        """Start the thread with the allow-list for the ZAP domain."""
        self.start()
        self.configure_curve_callback(domain=self.allow_list.security.domain, credentials_provider=self.allow_list)

    def shutdown(self, timeout_s: float = 5.0) -> bool:
        """Stop the thread and close its sockets; False if it did not stop within ``timeout_s``.

        Unlike ``stop()``, never blocks without a bound.
        """
        thread, pipe = self.thread, self.pipe
        if pipe is None:
            return True
        try:
            pipe.send(b"TERMINATE", zmq.NOBLOCK)
        except zmq.ZMQError:
            pass
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                return False
        pipe.close(linger=0)
        self.pipe = None  # type: ignore[assignment]
        self.thread = None  # type: ignore[assignment]
        if self.zap_socket is not None:
            self.zap_socket.close(linger=0)
            self.zap_socket = None  # type: ignore[assignment]
        return True


class SecureContext(zmq.Context):  # type: ignore[type-arg]
    """A context that runs a ZAP authenticator for the CURVE server sockets made on it.

    The authenticator starts with the first server socket (:meth:`ensure_authenticator`, called by
    ``make_socket``) and stops in :meth:`term` / :meth:`destroy`, before the context terminates,
    so closing the context never waits on it.
    """

    security: Security | None = None
    _authenticator: CurveAuthenticator | None = None
    _allow_list: AllowList | None = None
    _auth_lock: threading.Lock | None = None

    @classmethod
    def create(cls, security: Security | None, io_threads: int = 1) -> SecureContext:
        """A new context carrying ``security``."""
        ctx = cls(io_threads=io_threads)
        ctx.security = security
        ctx._auth_lock = threading.Lock()
        return ctx

    def ensure_authenticator(self, security: Security) -> None:
        """Start the ZAP authenticator for ``security`` unless it is running."""
        lock = self._auth_lock or threading.Lock()
        self._auth_lock = lock
        with lock:
            if self._authenticator is not None:
                if self._allow_list is not None and self._allow_list.security != security:
                    raise SecurityError("one context serves one set of CURVE keys; use a second context")
                return
            allow_list = AllowList(security)
            auth = CurveAuthenticator(self, allow_list)
            auth.start_curve()
            self._authenticator, self._allow_list = auth, allow_list
            log.info("CURVE: admitting %d client key(s) from %s plus the server key",
                     len(security.allowed - {security.server_public}), security.allowed_dir)

    def auth_counts(self) -> dict[str, int]:
        """Handshakes admitted and refused by this context's authenticator (zeros without one)."""
        if self._allow_list is None:
            return {"curve_allowed": 0, "curve_refused": 0}
        return self._allow_list.counts()

    def stop_authenticator(self, timeout_s: float = 5.0) -> bool:
        """Stop the authenticator (if any); False if its thread would not stop."""
        auth = self._authenticator
        if auth is None:
            return True
        if not auth.shutdown(timeout_s):
            log.error("CURVE authenticator thread did not stop within %.0f s", timeout_s)
            return False
        self._authenticator = None
        return True

    def term(self) -> None:
        """Stop the authenticator, then terminate the context (it would wait on the thread's sockets)."""
        if not self.stop_authenticator():
            return  # terminating now would hang on the stuck thread's sockets; let the process exit
        super().term()

    def destroy(self, linger: int | None = None) -> None:
        """Stop the authenticator first (its sockets belong to its thread), then close everything."""
        if self.closed:
            return
        if not self.stop_authenticator():
            return
        super().destroy(linger)


def keygen(directory: str | os.PathLike[str], name: str, *, force: bool = False,
           allow: bool = False) -> tuple[Path, Path]:
    """Write the key pair ``DIR/NAME.key`` and ``DIR/NAME.key_secret`` (secret mode 0600).

    The files are made in a private temporary directory and moved into place, so the secret
    is never readable by others.  Refuses to replace an existing pair unless ``force``.
    ``allow`` also copies the public key to ``DIR/clients/NAME.key`` (the default allow-list).
    Returns ``(public_path, secret_path)``.  Raises :class:`SecurityError` or ``OSError``.
    """
    if not has_curve():
        raise SecurityError("this pyzmq/libzmq has no CURVE support (it needs libsodium)")
    check_key_name(name, "--name")
    root = Path(directory).expanduser()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    public_path, secret_path = root / f"{name}{PUBLIC_SUFFIX}", root / f"{name}{SECRET_SUFFIX}"
    allowed_path = root / CLIENTS_DIR / f"{name}{PUBLIC_SUFFIX}"
    targets = [public_path, secret_path] + ([allowed_path] if allow else [])
    existing = [str(p) for p in targets if p.exists()]
    if existing and not force:
        raise SecurityError(f"refusing to overwrite {', '.join(existing)} (use --force to replace the key pair; "
                            "every peer then needs the new public key)")
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.keygen-", dir=root))  # mode 0700
    try:
        made_public, made_secret = (Path(p) for p in zmq.auth.create_certificates(tmp, name))
        os.chmod(made_secret, 0o600)
        os.chmod(made_public, 0o644)
        os.replace(made_secret, secret_path)
        os.replace(made_public, public_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    mode = stat.S_IMODE(secret_path.stat().st_mode)
    if mode != 0o600:
        raise SecurityError(f"could not make {str(secret_path)!r} private: mode is {mode:04o}, expected 0600")
    if allow:
        allowed_path.parent.mkdir(mode=0o755, exist_ok=True)
        shutil.copyfile(public_path, allowed_path)
    return public_path, secret_path
