#!/bin/sh
# mkcerts.sh DIR makes a test certificate authority and, signed by it, a server
# certificate for 127.0.0.1 and localhost and a client certificate, in DIR (PEM):
#   ca.pem ca.key  server.pem server.key  client.pem client.key
# For trying TLS and mutual TLS with the KV example; not for production.
set -eu
command -v openssl >/dev/null || { echo "mkcerts.sh: openssl is missing (apt-get install -y openssl)" >&2; exit 1; }
dir=${1:-certs}
mkdir -p "$dir"
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca.key
openssl req -x509 -new -key ca.key -days 30 -subj "/CN=mwrpc test CA" -out ca.pem
for who in server client; do
  key "$who.key"
  openssl req -new -key "$who.key" -subj "/CN=kv-$who" -out "$who.csr"
  if [ "$who" = server ]; then
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >"$who.ext"
  else
    printf 'extendedKeyUsage=clientAuth\n' >"$who.ext"
  fi
  openssl x509 -req -in "$who.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
    -extfile "$who.ext" -out "$who.pem" 2>/dev/null
  rm -f "$who.csr" "$who.ext"
done
rm -f ca.srl
echo "mkcerts.sh: wrote ca, server and client certificates and keys into $dir"
