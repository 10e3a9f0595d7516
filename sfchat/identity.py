"""A host's identity that lasts: its join token, kept in the config folder (readable by its user only), and its TLS
certificate (peers/links/tls.py keeps it in the data folder), both reused at every start of `sfchat host` and
`sfchat serve`. So an invite stays valid, and members waiting for their host (sfchat/join.py) join it again when it
is started again with the same command. `--new-token` makes a new token and a new certificate: every invite
printed before stops working."""
from __future__ import annotations

import os

from peers import config_dir, data_dir, new_token

TOKEN_FILE = "host-token"


def host_token(new: bool = False) -> str:
    """The token kept from the last start, or a new one (the first start, or `new`), kept for the next."""
    path = config_dir() / TOKEN_FILE
    if not new and path.is_file() and (kept := path.read_text().strip()):
        return kept
    if new:
        for name in ("host.crt", "host.key"):  # the certificate goes with it: made again at the TLS set-up
            (data_dir() / "tls" / name).unlink(missing_ok=True)
    token = new_token()
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)
    return token
