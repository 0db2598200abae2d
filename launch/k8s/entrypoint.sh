#!/bin/sh
# The zmqrl container's entrypoint (launch/k8s/Dockerfile): `zmqrl ARGS...`, after two chores.
#
#   zmqrl-entrypoint head CONFIG --run-dir /runs/run ...
#   zmqrl-entrypoint host CONFIG --learner HEAD ...   (with ZMQRL_ACTORS_PER_HOST=N: adds
#                                                        --actors N --first-id ORDINAL*N)
#
# 1. CurveZMQ keys: a Secret mounted at ZMQRL_KEYS_SECRET (default /etc/zmqrl/keys-secret; files
#    there are root's or group-readable) is copied to ZMQRL_KEYS_DIR (default /var/lib/zmqrl/keys,
#    the config's net.keys_dir) with the modes zmqrl expects: secret keys 0600, public keys 0644,
#    files named clients.NAME.key into clients/ (the keys servers admit).
# 2. A StatefulSet host's actor ids: its ordinal (the number ending POD_NAME, or the host name)
#    times N, so every pod's ids are unique and stay the same when the pod is replaced.
set -eu

secret=${ZMQRL_KEYS_SECRET:-/etc/zmqrl/keys-secret}
keys=${ZMQRL_KEYS_DIR:-/var/lib/zmqrl/keys}
if [ -d "$secret" ]; then
    mkdir -p "$keys/clients"
    chmod 0700 "$keys"
    for file in "$secret"/*; do
        [ -f "$file" ] || continue
        name=$(basename "$file")
        case "$name" in
            clients.*) install -m 0644 "$file" "$keys/clients/${name#clients.}" ;;
            *.key_secret) install -m 0600 "$file" "$keys/$name" ;;
            *) install -m 0644 "$file" "$keys/$name" ;;
        esac
    done
fi

if [ "${1:-}" = host ] && [ -n "${ZMQRL_ACTORS_PER_HOST:-}" ]; then
    pod=${POD_NAME:-$(hostname)}
    ordinal=${pod##*-}
    case "$ordinal" in
        '' | *[!0-9]*)
            echo "zmqrl-entrypoint: cannot read a StatefulSet ordinal from the pod name '$pod' (POD_NAME)" >&2
            exit 2 ;;
    esac
    set -- "$@" --actors "$ZMQRL_ACTORS_PER_HOST" --first-id $((ordinal * ZMQRL_ACTORS_PER_HOST)) --name "$pod"
fi
exec "${ZMQRL:-zmqrl}" "$@"
