# The app image: one image for every role of the platform (web, gateway,
# worker, beat, migrate, replica_register); compose and Kubernetes pick the
# role by command. Build:
#   docker build -t gpu-ledger:latest .
# BASE_IMAGE is any Debian-based image: the public Python slim image by
# default; a bare Debian root (no Python) works too, Debian's python3 is
# installed then (CI here, where no registry is reachable).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS python
# python3 -m venv needs ensurepip: Debian ships it as python3-venv.
RUN if ! command -v python3 >/dev/null || ! python3 -c "import ensurepip" 2>/dev/null; then \
      apt-get update -q \
      && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
         python3 python3-venv ca-certificates \
      && rm -rf /var/lib/apt/lists/*; \
    fi
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH

FROM python AS build
# A build machine behind a TLS-intercepting proxy passes the proxy's CA
# bundle as the build secret pip-cert (docker build / podman build --secret
# id=pip-cert,src=FILE; deploy/images/build does it from PIP_CERT): mounted
# for the install step only, never kept in the image. A local wheel folder
# (PIP_FIND_LINKS) is a path the builder mounts (podman -v).
ARG PIP_FIND_LINKS=
RUN python3 -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml ./
# The runtime dependencies only (not the dev extras), in their own layer:
# a code change does not reinstall them.
RUN --mount=type=secret,id=pip-cert,required=false \
    python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && if [ -f /run/secrets/pip-cert ]; then export PIP_CERT=/run/secrets/pip-cert; fi \
 && if [ -z "$PIP_FIND_LINKS" ]; then unset PIP_FIND_LINKS; fi \
 && pip install --no-cache-dir -q -r requirements.txt
COPY . /app
WORKDIR /app
# Static files are collected at build time and served by WhiteNoise.
RUN DJANGO_SETTINGS_MODULE=config.settings.production DJANGO_SECRET_KEY=collectstatic-only \
    API_KEY_PEPPER=collectstatic-only DATABASE_URL=postgres://build@localhost/build \
    python manage.py collectstatic --noinput -v 0

FROM python AS runtime
RUN useradd --system --uid 10001 --user-group --home-dir /app --no-create-home app
COPY --from=build /opt/venv /opt/venv
COPY --from=build --chown=root:root /app /app
# Local state the processes write: the gateway's spool and dead-letter
# file, the worker's ledger archives. Made here so a volume mounted on them
# starts out owned by the app's user.
RUN mkdir -p /app/var/spool /app/var/archive && chown -R app:app /app/var
WORKDIR /app
ENV DJANGO_SETTINGS_MODULE=config.settings.production PYTHONPATH=/app
USER app
EXPOSE 8000 8080 9090
# The web role's check (the default command); compose and Kubernetes give
# each other role its own.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=6 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]
CMD ["python", "manage.py", "web", "--host", "0.0.0.0", "--port", "8000", "--workers", "2"]
