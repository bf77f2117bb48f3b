"""Security options on real servers on loopback, with tritonclient over HTTP and gRPC (issue 21 item 5): a bearer
token on every route but health (and /metrics unless --auth-metrics), TLS and mutual TLS with certificates made
at test time, the repository control API off by default (403 / PERMISSION_DENIED naming the flag), unsupported
load overrides refused naming them, and the warning for a non-loopback --host without a token."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.conftest import make_mlp
from tests.serve.conftest import ServerProcess

TOKEN = "s3cret-token-for-tests"
X = np.array([[0.5, 0.1, 0.2, 0.3]], np.float32)


def http_input():
    tensor = thttp.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    return [tensor]


def grpc_input():
    tensor = tgrpc.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    return [tensor]


@pytest.fixture(scope="module")
def token_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("token")
    make_mlp(root / "mlp.onnx")
    (root / "token").write_text(TOKEN + "\n")
    proc = ServerProcess(root / "mlp.onnx", "--auth-token-file", str(root / "token"), log=root / "server.log")
    yield proc.wait_ready()
    assert proc.stop() == 0, proc.log()


def test_http_needs_the_token_except_health_and_metrics(token_server):
    url = token_server.url.removeprefix("http://")
    anonymous = thttp.InferenceServerClient(url)
    with pytest.raises(InferenceServerException) as refused:
        anonymous.infer("mlp", http_input())
    assert "401" in str(refused.value.status()) and "Bearer" in refused.value.message()
    assert anonymous.is_server_live() and anonymous.is_server_ready()
    assert httpx.get(f"{token_server.url}/metrics").status_code == 200
    for path in ("/v2", "/v2/models/mlp", "/openapi.json", "/v2/models/stats"):
        response = httpx.get(f"{token_server.url}{path}")
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer", path
    wrong = httpx.get(f"{token_server.url}/v2", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    client = thttp.InferenceServerClient(url)
    result = client.infer("mlp", http_input(), headers={"Authorization": f"Bearer {TOKEN}"})
    assert result.as_numpy("probs").shape == (1, 3)


def test_grpc_needs_the_token_except_health(token_server):
    client = tgrpc.InferenceServerClient(token_server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("mlp", grpc_input())
    assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("mlp")
    assert client.is_server_live() and client.is_server_ready()
    result = client.infer("mlp", grpc_input(), headers={"authorization": f"Bearer {TOKEN}"})
    assert result.as_numpy("probs").shape == (1, 3)
    client.close()


def test_the_token_from_the_environment_and_auth_metrics(tmp_path):
    make_mlp(tmp_path / "mlp.onnx")
    server = ServerProcess(tmp_path / "mlp.onnx", "--auth-metrics", "--no-grpc", log=tmp_path / "server.log",
                           env={"ONNXACCEL_AUTH_TOKEN": TOKEN}).wait_ready()
    try:
        assert httpx.get(f"{server.url}/metrics").status_code == 401
        auth = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"{server.url}/metrics", headers=auth).status_code == 200
    finally:
        assert server.stop() == 0


# --- TLS ------------------------------------------------------------------------------------------------

def _certificates(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, all signed by the CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)

    def name(text):
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    def write(stem, key, cert):
        (folder / f"{stem}.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                                serialization.PrivateFormat.PKCS8,
                                                                serialization.NoEncryption()))
        (folder / f"{stem}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(name("test ca")).issuer_name(name("test ca"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    write("ca", ca_key, ca)
    for stem, usage, sans in (("server", x509.ExtendedKeyUsageOID.SERVER_AUTH,
                               [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                              ("client", x509.ExtendedKeyUsageOID.CLIENT_AUTH, [x509.DNSName("client")])):
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(stem)).issuer_name(ca.subject)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        write(stem, key, cert)
    return {stem: folder / f"{stem}.pem" for stem in ("ca", "server", "client")} | {
        f"{stem}_key": folder / f"{stem}.key" for stem in ("server", "client")}


def _client_context(certs, *, with_cert: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs["ca"]))
    if with_cert:
        context.load_cert_chain(str(certs["client"]), str(certs["client_key"]))
    return context


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    """HTTPS + gRPC over TLS, client certificates required (mutual TLS), and a token."""
    pytest.importorskip("cryptography")
    root = tmp_path_factory.mktemp("tls")
    certs = _certificates(root)
    make_mlp(root / "mlp.onnx")
    proc = ServerProcess(root / "mlp.onnx", "--tls-cert", str(certs["server"]), "--tls-key",
                         str(certs["server_key"]), "--tls-client-ca", str(certs["ca"]), log=root / "server.log",
                         env={"ONNXACCEL_AUTH_TOKEN": TOKEN})
    proc.url = proc.url.replace("http://", "https://")
    context = _client_context(certs)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None, proc.log()
        try:
            if httpx.get(f"{proc.url}/v2/health/ready", verify=context, timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.certs = certs
    yield proc
    assert proc.stop() == 0, proc.log()


def test_https_with_client_certificates_and_token(tls_server):
    certs = tls_server.certs
    url = tls_server.url.removeprefix("https://")
    client = thttp.InferenceServerClient(url, ssl=True, ssl_context_factory=lambda: _client_context(certs))
    result = client.infer("mlp", http_input(), headers={"Authorization": f"Bearer {TOKEN}"})
    assert result.as_numpy("probs").shape == (1, 3)
    with pytest.raises(httpx.HTTPError):  # no client certificate: the handshake fails
        httpx.get(f"{tls_server.url}/v2/health/live", verify=_client_context(certs, with_cert=False), timeout=5)
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
        httpx.get(f"http://{url}/v2/health/live", timeout=5)


def test_grpc_over_tls_with_client_certificates_and_token(tls_server):
    certs = tls_server.certs
    client = tgrpc.InferenceServerClient(tls_server.grpc_url, ssl=True, root_certificates=str(certs["ca"]),
                                         private_key=str(certs["client_key"]),
                                         certificate_chain=str(certs["client"]))
    result = client.infer("mlp", grpc_input(), headers={"authorization": f"Bearer {TOKEN}"})
    assert result.as_numpy("probs").shape == (1, 3)
    client.close()
    no_cert = tgrpc.InferenceServerClient(tls_server.grpc_url, ssl=True, root_certificates=str(certs["ca"]))
    with pytest.raises(InferenceServerException):
        no_cert.is_server_live(client_timeout=5)
    no_cert.close()


def test_bad_tls_options_stop_with_a_clear_error(tmp_path):
    make_mlp(tmp_path / "mlp.onnx")
    (tmp_path / "cert.pem").write_text("not a certificate")
    for args, expected in (([("--tls-cert", "cert.pem")], "--tls-cert and --tls-key go together"),
                           ([("--tls-cert", "cert.pem"), ("--tls-key", "cert.pem")], "Cannot load the TLS files"),
                           ([("--auth-token-file", "missing")], "Cannot read --auth-token-file")):
        flat = [part if not part.endswith((".pem", "missing")) else str(tmp_path / part) for a in args for part in a]
        server = ServerProcess(tmp_path / "mlp.onnx", *flat, log=tmp_path / "bad.log")
        assert server.proc.wait(60) == 2
        log = server.log()
        server.stop()
        assert expected in log and "Traceback" not in log, log


# --- model control ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("control")
    make_mlp(root / "mlp.onnx")
    proc = ServerProcess(root, log=root / "server.log")
    yield proc.wait_ready()
    assert proc.stop() == 0, proc.log()


def test_the_control_api_is_off_by_default(default_server):
    http = thttp.InferenceServerClient(default_server.url.removeprefix("http://"))
    with pytest.raises(InferenceServerException) as refused:
        http.unload_model("mlp")
    assert "--model-control explicit" in refused.value.message()
    grpc = tgrpc.InferenceServerClient(default_server.grpc_url)
    with pytest.raises(InferenceServerException) as refused:
        grpc.unload_model("mlp")
    assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
    assert "--model-control explicit" in refused.value.message()
    with pytest.raises(InferenceServerException):
        grpc.load_model("mlp")
    assert http.is_model_ready("mlp")  # nothing was unloaded
    assert [m["name"] for m in http.get_model_repository_index()] == ["mlp"]  # the index stays readable
    grpc.close()


def test_unsupported_load_overrides_are_refused_naming_them(tmp_path):
    make_mlp(tmp_path / "mlp.onnx")
    server = ServerProcess(tmp_path, "--model-control", "explicit", log=tmp_path / "server.log").wait_ready()
    try:
        http = thttp.InferenceServerClient(server.url.removeprefix("http://"))
        with pytest.raises(InferenceServerException) as refused:
            http.load_model("mlp", config='{"max_batch_size": 4}')
        assert "400" in str(refused.value.status()) and "config" in refused.value.message()
        with pytest.raises(InferenceServerException) as refused:
            http.load_model("mlp", files={"file:1/model.onnx": b"x"})
        assert "file:1/model.onnx" in refused.value.message()
        grpc = tgrpc.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException) as refused:
            grpc.load_model("mlp", config='{"max_batch_size": 4}')
        assert refused.value.status() == "StatusCode.INVALID_ARGUMENT" and "config" in refused.value.message()
        grpc.unload_model("mlp")  # explicit: control works
        assert not http.is_model_ready("mlp")
        http.load_model("mlp")
        assert http.is_model_ready("mlp")
        grpc.close()
    finally:
        assert server.stop() == 0, server.log()


def test_a_non_loopback_host_without_a_token_warns_how_to_add_one(tmp_path):
    make_mlp(tmp_path / "mlp.onnx")
    server = ServerProcess(tmp_path / "mlp.onnx", "--host", "127.0.0.2", "--no-grpc", "--shared-memory", "system",
                           log=tmp_path / "server.log")
    deadline = time.monotonic() + 60
    while "serving" not in server.log() and time.monotonic() < deadline and server.proc.poll() is None:
        time.sleep(0.1)
    log = server.log()
    server.stop()
    assert "without a token" in log and "--auth-token-file" in log, log
    # Shared memory given: the warning says it stays with local clients (a remote one is refused it).
    assert "remote client is refused" in " ".join(log.split()), log
