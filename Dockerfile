# llmgw: llmgw-server, llmgw-agent, llmgw-cli and llmgw-sim-engine in one image.
# compose.yaml runs every service from it; docs/operations.md covers real deployments.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/llmgw/src
# The locked runtime packages first (hash-checked, nothing resolved again: the versions CI
# tested), then llmgw itself on top of them.
COPY requirements/runtime.txt ./requirements/
RUN pip install --require-hashes --no-deps -r requirements/runtime.txt
COPY pyproject.toml README.md ./
COPY app ./app
COPY agent ./agent
COPY cli ./cli
COPY wire ./wire
RUN pip install --no-deps --no-build-isolation . && pip check && cd / && rm -rf /opt/llmgw/src

# The directories named volumes are mounted on are created here, owned by the llmgw user:
# Docker gives an empty named volume the owner of its mount point in the image.
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/llmgw --shell /usr/sbin/nologin llmgw \
    && mkdir -p /var/lib/llmgw/ca /var/lib/llmgw/certs /var/lib/llmgw/agent \
    && chown -R llmgw:llmgw /var/lib/llmgw \
    && chmod 0700 /var/lib/llmgw/ca

USER llmgw
WORKDIR /var/lib/llmgw
ENV HOME=/var/lib/llmgw

CMD ["llmgw-server", "--help"]
