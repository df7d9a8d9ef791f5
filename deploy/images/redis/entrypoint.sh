#!/bin/sh
# As the official image does: a redis-server started without a config file
# answers on its container network (protected mode refuses that otherwise).
set -eu
if [ "${1:-}" = redis-server ]; then
  shift
  exec redis-server --bind "0.0.0.0" --protected-mode no "$@"
fi
exec "$@"
