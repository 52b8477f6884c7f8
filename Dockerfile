# jaxmon: Prometheus exporter for JAX accelerators.
#
#   docker build -t jaxmon:cpu .                                # CPU only: the spool sidecar, replay demos
#   docker build -t jaxmon:cuda --build-arg FLAVOUR=cuda .      # + jax[cuda12] (CUDA wheels; needs --gpus at run time)
#   docker build -t jaxmon:tpu --build-arg FLAVOUR=tpu .        # + jax[tpu] (libtpu)
#
# Runs `jaxmon serve` as an unprivileged user (uid 10401) on port 10401; settings come as flags after the image
# name or as JAXMON_* environment variables (the HEALTHCHECK follows them: nothing to pass it). docs/deploy.md has
# the compose stack, the sidecar and Kubernetes.
# With podman or buildah, build with `--format docker`: the OCI image format has no HEALTHCHECK and they drop it.
# No `# syntax=` line: it would make BuildKit fetch a frontend image from Docker Hub, and nothing here needs one.
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
ARG FLAVOUR=cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The dependencies first, from pyproject.toml alone, so that a change to jaxmon's code or README rebuilds only the
# small layer of jaxmon itself. Every flavour installs the serve extra (the daemon's sources: tpu-info, the kubelet's
# grpcio and protobuf, rich for jaxmon top); FLAVOUR picks the accelerator extra of pyproject.toml: cpu -> none,
# cuda -> [cuda], tpu -> [tpu]; its requirements are installed with the project's.
# Then leave out what is not needed at run time (BENCHMARKS.md has the sizes): the test suites of the
# dependencies and the symbol tables of jaxlib's libraries (about 100 MB; .dynsym, which loading needs, stays;
# XLA's crash stack traces show addresses instead of function names); pip, setuptools and wheel go last.
COPY pyproject.toml ./
# DL3008 (pin apt versions): binutils only runs in this build stage and never reaches the image; a pinned
# version would break whenever the base image's Debian release moves on.
# hadolint ignore=DL3008
RUN case "$FLAVOUR" in \
      cpu) extra="" ;; \
      cuda) extra="[cuda]" ;; \
      tpu) extra="[tpu]" ;; \
      *) echo "FLAVOUR must be cpu, cuda or tpu, not '$FLAVOUR'" >&2; exit 2 ;; \
    esac \
    && python -m venv /opt/jaxmon \
    && python -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; x = sys.argv[1].strip("[]"); print("\n".join(p["dependencies"] + p["optional-dependencies"]["serve"] + (p["optional-dependencies"][x] if x else [])))' "$extra" > /tmp/requirements.txt \
    && /opt/jaxmon/bin/pip install -r /tmp/requirements.txt \
    && apt-get update \
    && apt-get install -y --no-install-recommends binutils \
    && find /opt/jaxmon -path '*/jaxlib/*' -name '*.so' -exec strip --strip-unneeded {} + \
    && find /opt/jaxmon -depth -type d -name tests -path '*/site-packages/*' -exec rm -rf {} +
COPY README.md ./
COPY jaxmon ./jaxmon
# jaxmon itself; then check that the dependencies fit it and that JAX still compiles and runs a program.
RUN /opt/jaxmon/bin/pip install --no-deps . \
    && /opt/jaxmon/bin/pip check \
    && /opt/jaxmon/bin/python -m pip uninstall -y -q pip setuptools wheel \
    && /opt/jaxmon/bin/python -c "import jax, jax.numpy as jnp; assert int(jax.jit(jnp.sum)(jnp.ones(8))) == 8" \
    && /opt/jaxmon/bin/jaxmon --version

FROM python:${PYTHON_VERSION}-slim
ARG FLAVOUR=cpu
LABEL org.opencontainers.image.title="jaxmon" \
      org.opencontainers.image.description="Prometheus exporter for JAX accelerators (${FLAVOUR})" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/jaxmon /opt/jaxmon
# The spool directory /run/jaxmon is like /tmp (root:root, mode 1777): a fresh named volume mounted there copies
# that, whoever mounts it first, so a trainer of any uid can publish (root, jaxmon's 10401, an arbitrary one), and
# the sticky bit lets only a file's owner (or root) replace or remove it. Publishers write files with mode 0644,
# which the sidecar (uid 10401) reads through a read-only mount. /run, not /var/run: /var/run is a symlink to /run,
# and a volume mounted through it takes the first container's owner instead of the image directory's (podman).
RUN groupadd --system --gid 10401 jaxmon \
    && useradd --system --uid 10401 --gid 10401 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin jaxmon \
    && install -d -m 1777 -o root -g root /run/jaxmon \
    && install -d -m 0755 -o 10401 -g 10401 /var/lib/jaxmon
# The probe keeps each device's idle calibration in /var/lib/jaxmon: a restarted container reuses it instead of
# calibrating beside training that is already running. Mount a volume there to keep it across new containers.
ENV PATH=/opt/jaxmon/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    JAXMON_LOG__FORMAT=json \
    JAXMON_COLLECTOR__PROBE__BASELINE_FILE=/var/lib/jaxmon/probe-baseline.json
USER 10401:10401
EXPOSE 10401
# The HEALTHCHECK asks the daemon for /healthz (200 while polls are fresh) on a Unix socket the daemon makes at start
# (JAXMON_HEALTH__SOCKET: 0600, in a 0700 directory of the daemon's uid), not on its listener: a moved
# --web.listen-address, TLS, client certificates or basic auth in the web config need nothing passed to the check,
# and the check holds no credential of the listener's. `jaxmon healthcheck` reads the same JAXMON_* settings as the
# daemon. With --read-only, give /tmp a tmpfs (--tmpfs /tmp) so that the socket can be made. DESIGN.md section 14.
ENV JAXMON_HEALTH__SOCKET=/tmp/jaxmon-health/health.sock
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 CMD ["jaxmon", "healthcheck"]
ENTRYPOINT ["jaxmon"]
CMD ["serve"]
