#!/usr/bin/env bash
# Make TLS certificates for a local Flower deployment (SuperLink on localhost / 127.0.0.1 / ::1):
#   <outdir>/ca.key, ca.crt          a self-signed CA (RSA 2048, 365 days)
#   <outdir>/server.key, server.pem  the SuperLink's key and certificate, signed by that CA, with
#                                    subjectAltName DNS:localhost, IP:127.0.0.1, IP:::1 (365 days)
# Usage: bash scripts/make_certs.sh <outdir>        (FORCE=1 to replace certificates that are still valid)
# Idempotent: when all four files exist, the server certificate verifies against the CA and neither expires within
# a day, nothing is rewritten. The SuperLink uses ca.crt, server.pem, server.key; SuperNodes and `flwr` need ca.crt.
set -euo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 <outdir>" >&2
    exit 2
fi
command -v openssl >/dev/null || { echo "openssl not found on PATH" >&2; exit 1; }

OUT="$1"
DAYS=365
mkdir -p "$OUT"
CA_KEY="$OUT/ca.key" CA_CRT="$OUT/ca.crt" KEY="$OUT/server.key" CRT="$OUT/server.pem"

valid() {
    [[ -s "$CA_KEY" && -s "$CA_CRT" && -s "$KEY" && -s "$CRT" ]] || return 1
    openssl verify -CAfile "$CA_CRT" "$CRT" >/dev/null 2>&1 || return 1
    openssl x509 -in "$CA_CRT" -noout -checkend 86400 >/dev/null 2>&1 || return 1
    openssl x509 -in "$CRT" -noout -checkend 86400 >/dev/null 2>&1 || return 1
    # the key must belong to the certificate
    [[ "$(openssl x509 -in "$CRT" -noout -pubkey)" == "$(openssl pkey -in "$KEY" -pubout)" ]]
}

if [[ "${FORCE:-0}" != "1" ]] && valid; then
    echo "Certificates in $OUT are present and valid; nothing rewritten (FORCE=1 to replace):"
else
    TMP="$(mktemp -d)"
    trap 'rm -rf "$TMP"' EXIT
    umask 077
    # CA
    openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$DAYS" \
        -keyout "$TMP/ca.key" -out "$TMP/ca.crt" -subj "/CN=dpfedsam-flower local CA" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    # server key + CSR, then the certificate signed by the CA with the SANs
    openssl req -newkey rsa:2048 -nodes -sha256 -keyout "$TMP/server.key" -out "$TMP/server.csr" \
        -subj "/CN=localhost" 2>/dev/null
    cat >"$TMP/server.ext" <<'EOF'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1, IP:::1
EOF
    openssl x509 -req -in "$TMP/server.csr" -CA "$TMP/ca.crt" -CAkey "$TMP/ca.key" -CAcreateserial \
        -CAserial "$TMP/ca.srl" -days "$DAYS" -sha256 -extfile "$TMP/server.ext" -out "$TMP/server.pem" 2>/dev/null
    openssl verify -CAfile "$TMP/ca.crt" "$TMP/server.pem" >/dev/null
    chmod 600 "$TMP/ca.key" "$TMP/server.key"
    chmod 644 "$TMP/ca.crt" "$TMP/server.pem"
    mv -f "$TMP/ca.key" "$CA_KEY"
    mv -f "$TMP/ca.crt" "$CA_CRT"
    mv -f "$TMP/server.key" "$KEY"
    mv -f "$TMP/server.pem" "$CRT"
    echo "Wrote certificates to $OUT:"
fi
echo "  $CA_KEY    CA private key (keep it; not needed by Flower)"
echo "  $CA_CRT    CA certificate: --ssl-ca-certfile (SuperLink), --root-certificates (SuperNode), root-certificates (flwr)"
echo "  $KEY   SuperLink private key: --ssl-keyfile"
echo "  $CRT   SuperLink certificate (SAN DNS:localhost, IP:127.0.0.1, IP:::1): --ssl-certfile"
