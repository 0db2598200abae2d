"""``zmqrl keygen DIR --name NAME``: make a CurveZMQ key pair for ``net.security: curve``."""

from __future__ import annotations

import argparse
import sys

from zmqrl.cli.common import Command
from zmqrl.wire.security import CLIENTS_DIR, SecurityError, keygen


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write DIR/NAME.key and DIR/NAME.key_secret (mode 0600); 0 on success, 2 on error."""
    try:
        public, secret = keygen(args.dir, args.name, force=args.force, allow=args.client)
    except (SecurityError, OSError) as exc:
        print(f"zmqrl keygen: {exc}", file=sys.stderr)
        return 2
    print(f"public key: {public}  (copy to every host that needs it)")
    print(f"secret key: {secret}  (mode 0600; keep it on this key's hosts only)")
    if args.client:
        print(f"allowed:    {public.parent / CLIENTS_DIR / public.name}  (servers using {args.dir} admit this key)")
    return 0


def keygen_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", help="key directory (net.keys_dir); created if missing")
    p.add_argument("--name", default="server", help="key pair name (default: server)")
    p.add_argument("--client", action="store_true",
                   help=f"also copy the public key to DIR/{CLIENTS_DIR}/ so servers admit it")
    p.add_argument("--force", action="store_true", help="replace an existing key pair of that name")


COMMANDS = [Command("keygen", "make a CurveZMQ key pair for net.security: curve", keygen_args, cmd_keygen,
                    "Write DIR/NAME.key (public) and DIR/NAME.key_secret (secret, mode 0600). Servers (learner, "
                    "proxies) use the pair named by net.server_key; clients use net.client_key (default: the server "
                    f"pair). Servers admit the public keys in DIR/{CLIENTS_DIR}/ plus their own.")]
