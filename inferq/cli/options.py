"""The flags every command that talks to Redis shares (``--redis-url``, ``--tls-*``), defined
once, and the ``ConnectionSettings`` they make (unset flags fall back to the environment); and
what a command says when its extra is not installed (``missing_extra``)."""

from __future__ import annotations

import argparse
import sys
from typing import TypeAlias

from inferq.connection import (
    DEFAULT_URL,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    URL_ENV,
    ConnectionSettings,
)

#: What ``add_subparsers`` returns: each command module adds its parser to it.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and each option's default after its help, unless the help
    already says it, or there is none to show (None, False, absent)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (default is None or default is False or default == argparse.SUPPRESS
                or "default" in text or action.option_strings == []
                or isinstance(action, argparse._HelpAction | argparse._VersionAction)):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def add_connection_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", default=None, metavar="URL",
                        help=f"Redis URL (default ${URL_ENV} or {DEFAULT_URL}); "
                             "redis://[[user]:password@]host:port/db, rediss:// for TLS")
    tls = parser.add_argument_group("TLS (rediss:// URLs)")
    tls.add_argument("--tls-ca", metavar="PEM", default=None,
                     help=f"CA bundle that signed the server certificate (default ${TLS_CA_ENV}; "
                          "else the system CAs)")
    tls.add_argument("--tls-cert", metavar="PEM", default=None,
                     help="client certificate, for servers with tls-auth-clients "
                          f"(default ${TLS_CERT_ENV})")
    tls.add_argument("--tls-key", metavar="PEM", default=None,
                     help=f"client key, unless inside --tls-cert (default ${TLS_KEY_ENV})")


def connection_from_args(args: argparse.Namespace) -> ConnectionSettings:
    return ConnectionSettings.from_env(args.redis_url, ssl_ca_certs=args.tls_ca,
                                       ssl_certfile=args.tls_cert, ssl_keyfile=args.tls_key)


def missing_extra(command: str, extra: str, exc: ImportError) -> int:
    """Say that ``inferq COMMAND`` needs ``inferq[EXTRA]`` (and what failed to import); the
    exit status, 2."""
    print(f"inferq {command} needs the {extra} extra: pip install 'inferq[{extra}]' ({exc})",
          file=sys.stderr)
    return 2
