"""Who may call the server: the bearer token (HTTP and gRPC; the health probes answer without it) and TLS (the
server's certificate, and client certificates with --tls-client-ca). docs/SECURITY.md describes the threat model.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from onnxaccel.errors import UsageError

#: The environment variable holding the bearer token (``--auth-token-file`` takes precedence).
TOKEN_ENV = "ONNXACCEL_AUTH_TOKEN"

#: Routes answered without a token: the health probes (a load balancer or kubelet has none).
PUBLIC_HTTP = frozenset({"/v2/health/live", "/v2/health/ready"})
#: gRPC methods answered without a token (the same probes).
PUBLIC_GRPC = frozenset({"ServerLive", "ServerReady"})

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def read_token(path: str | None) -> str | None:
    """The bearer token from ``path`` (``--auth-token-file``, surrounding whitespace stripped) or from the
    ONNXACCEL_AUTH_TOKEN environment variable; None when neither is set. An empty or unreadable file is a
    UsageError: a server meant to be protected must not start open."""
    if path:
        try:
            token = Path(path).read_text().strip()
        except OSError as exc:
            raise UsageError(f"Cannot read --auth-token-file {path}: {exc.strerror or exc}.",
                             "Give a readable file holding the token (e.g. `openssl rand -hex 32 > token`).") from None
        if not token:
            raise UsageError(f"--auth-token-file {path} is empty.", "Write the token into it, e.g. "
                             "`openssl rand -hex 32 > token`.")
        return token
    token = os.environ.get(TOKEN_ENV, "").strip()
    return token or None


def token_matches(header: str | bytes | None, token: str) -> bool:
    """Whether an ``Authorization`` value is ``Bearer <token>``, compared in constant time."""
    if header is None:
        return False
    if isinstance(header, str):
        header = header.encode("latin-1", "replace")
    scheme, _, given = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token.encode())


def check_tls_files(cert: str | None, key: str | None, client_ca: str | None) -> None:
    """--tls-cert and --tls-key come together, --tls-client-ca only with them, and every file loads; a
    UsageError naming the file otherwise (before any port is bound)."""
    if bool(cert) != bool(key):
        raise UsageError("--tls-cert and --tls-key go together.", "Give both (PEM certificate chain and its key).")
    if client_ca and not cert:
        raise UsageError("--tls-client-ca verifies client certificates, which needs TLS.",
                         "Add --tls-cert and --tls-key.")
    if not cert:
        return
    import ssl  # here: the command line imports this module to build `serve`, with or without TLS

    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        if client_ca:
            context.load_verify_locations(client_ca)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"Cannot load the TLS files (--tls-cert {cert}, --tls-key {key}"
                         + (f", --tls-client-ca {client_ca}" if client_ca else "") + f"): {exc}.",
                         "Give PEM files: the certificate chain, its unencrypted private key, and the CA that "
                         "signs client certificates.") from None


def uvicorn_tls(config) -> dict:
    """uvicorn.Config keyword arguments for the server's TLS settings (none without --tls-cert)."""
    if not config.tls_cert:
        return {}
    options = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key}
    if config.tls_client_ca:
        import ssl

        options.update(ssl_ca_certs=config.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def grpc_credentials(config):
    """grpc server credentials for the TLS settings, or None for an insecure port."""
    if not config.tls_cert:
        return None
    import grpc

    key, cert = Path(config.tls_key).read_bytes(), Path(config.tls_cert).read_bytes()
    ca = Path(config.tls_client_ca).read_bytes() if config.tls_client_ca else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def grpc_auth_interceptor(token: str):
    """A grpc.aio interceptor answering UNAUTHENTICATED to every call without ``authorization: Bearer <token>``
    metadata, except the health probes."""
    import grpc

    async def deny(_request, context):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                            "This server needs a token: send the metadata 'authorization: Bearer <token>'.")

    denied = grpc.unary_unary_rpc_method_handler(deny, request_deserializer=lambda b: b)

    class AuthInterceptor(grpc.aio.ServerInterceptor):
        async def intercept_service(self, continuation, details):
            if details.method.rsplit("/", 1)[-1] in PUBLIC_GRPC:
                return await continuation(details)
            for key, value in details.invocation_metadata or ():
                if key == "authorization" and token_matches(value, token):
                    return await continuation(details)
            return denied

    return AuthInterceptor()
