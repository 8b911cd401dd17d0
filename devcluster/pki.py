"""The dev cluster's certificates, made with the openssl command.

One CA signs everything: the API server's serving certificate (also used by KWOK's kubelet
endpoint and Kueue's webhooks, so its SANs cover 127.0.0.1 and localhost), the admin client
certificate (group system:masters) and the front-proxy client used by aggregated APIs.
Service-account tokens are signed by a separate RSA key. Files are created once and kept.
"""

from __future__ import annotations

import pathlib
import subprocess
import tempfile

DAYS = "3650"


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        msg = f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}"
        raise RuntimeError(msg)


def _sign(d: pathlib.Path, name: str, subject: str, ext: str) -> None:
    """Sign `name`.crt unless it exists with the same subject and extensions (kept beside it
    in `name`.ext, so a new SAN, e.g. the real node's link address, re-signs it)."""
    recorded = d / f"{name}.ext"
    want = f"{subject}\n{ext}"
    if (d / f"{name}.crt").exists() and recorded.exists() and recorded.read_text() == want:
        return
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out",
             f"{name}.csr", "-subj", subject, cwd=d)  # fmt: skip
    with tempfile.NamedTemporaryFile("w", suffix=".ext", dir=d, delete=False) as fh:
        fh.write(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", DAYS, "-out", f"{name}.crt", "-extfile", fh.name,
             cwd=d)  # fmt: skip
    pathlib.Path(fh.name).unlink()
    (d / f"{name}.csr").unlink()
    recorded.write_text(want)


def ensure(d: pathlib.Path, extra_ips: tuple[str, ...] = ()) -> pathlib.Path:
    """Create the CA, certificates and signing key under `d` unless they exist; return `d`.

    `extra_ips` are more addresses the API server's serving certificate covers (the host end
    of the real node's link, where pods and the kubelet reach it)."""
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "ca.crt").exists():
        cnf = d / "ca.cnf"
        cnf.write_text(
            "[req]\ndistinguished_name=dn\nx509_extensions=v3\nprompt=no\n"
            "[dn]\nCN=taugrid-dev-ca\n"
            "[v3]\nbasicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n"
            "subjectKeyIdentifier=hash\n"
        )
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-keyout",
                 "ca.key", "-out", "ca.crt", "-config", "ca.cnf", cwd=d)  # fmt: skip
    server_ext = (
        f"subjectAltName=IP:127.0.0.1,{''.join(f'IP:{ip},' for ip in extra_ips)}"
        "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    client_ext = "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    _sign(d, "serving", "/CN=127.0.0.1", server_ext)
    _sign(d, "admin", "/CN=taugrid-admin/O=system:masters", client_ext)
    _sign(d, "front-proxy-client", "/CN=front-proxy-client", client_ext)
    if not (d / "sa.key").exists():
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)
    return d


def ensure_node(d: pathlib.Path, node: str, node_ip: str) -> tuple[str, str]:
    """The real node's kubelet certificates: a client certificate in group system:nodes (the
    `system:node` role is bound to that group) and a serving certificate for its address,
    which the API server checks against our CA. Return the two names (`<name>.crt/.key`)."""
    if not (d / "ca.crt").exists():
        msg = f"no CA in {d}: the dev cluster's PKI is made by `up` first"
        raise RuntimeError(msg)
    client = f"node-{node}"
    serving = f"kubelet-serving-{node}"
    _sign(d, client, f"/CN=system:node:{node}/O=system:nodes",
          "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n")  # fmt: skip
    _sign(d, serving, f"/CN={node}",
          f"subjectAltName=IP:{node_ip},DNS:{node}\nextendedKeyUsage=serverAuth\n"
          "keyUsage=digitalSignature,keyEncipherment\n")  # fmt: skip
    return client, serving
