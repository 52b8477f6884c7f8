# syntax=docker/dockerfile:1
# jaxmon: Prometheus exporter for JAX accelerators.
#
#   docker build -t jaxmon:cpu .                                # CPU only: the spool sidecar, replay demos
#   docker build -t jaxmon:cuda --build-arg FLAVOUR=cuda .      # + jax[cuda12] (CUDA wheels; needs --gpus at run time)
#   docker build -t jaxmon:tpu --build-arg FLAVOUR=tpu .        # + jax[tpu] (libtpu)
#
# Runs `jaxmon serve` as an unprivileged user (uid 10401) on port 10401; settings come as flags after the image
# name or as JAXMON_* environment variables. docs/deploy.md has the compose stack, the sidecar and Kubernetes.
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
ARG FLAVOUR=cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY jaxmon ./jaxmon
# FLAVOUR picks the pip extra of pyproject.toml: cpu -> none, cuda -> [cuda], tpu -> [tpu].
RUN case "$FLAVOUR" in \
      cpu) extra="" ;; \
      cuda) extra="[cuda]" ;; \
      tpu) extra="[tpu]" ;; \
      *) echo "FLAVOUR must be cpu, cuda or tpu, not '$FLAVOUR'" >&2; exit 2 ;; \
    esac \
    && python -m venv /opt/jaxmon \
    && /opt/jaxmon/bin/pip install ".${extra}" \
    && /opt/jaxmon/bin/jaxmon --version

FROM python:${PYTHON_VERSION}-slim
ARG FLAVOUR=cpu
LABEL org.opencontainers.image.title="jaxmon" \
      org.opencontainers.image.description="Prometheus exporter for JAX accelerators (${FLAVOUR})" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/jaxmon /opt/jaxmon
# The spool directory exists and belongs to jaxmon, so a fresh named volume mounted there is writable by a
# trainer running as the same user, and readable by the sidecar.
RUN groupadd --system --gid 10401 jaxmon \
    && useradd --system --uid 10401 --gid 10401 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin jaxmon \
    && mkdir -p /var/run/jaxmon \
    && chown 10401:10401 /var/run/jaxmon
ENV PATH=/opt/jaxmon/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    JAXMON_LOG__FORMAT=json
USER 10401:10401
EXPOSE 10401
# /healthz is 200 while polls are fresh. Python's urllib, since the slim image has no curl; a changed
# --web.listen-address or TLS needs its own healthcheck (docker run --health-cmd ...).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:10401/healthz', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["jaxmon"]
CMD ["serve"]
