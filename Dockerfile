# Sluice binaries (sluice-consumer, sluice-recorder, sluice-api, sluice-produce, sluicectl) on
# Debian 12.
#
#   docker build -t sluice:dev .
#   docker run --rm sluice:dev sluice-consumer --help-config
#
# Used by compose.yaml (services sluice-consumer, sluice-recorder and sluice-api). Configuration is the
# same environment as everywhere else: SLUICE_KAFKA_BROKERS, SLUICE_REDIS_URL, SLUICE_PG_DSN,
# SLUICE_MASTER_KEY, ... (`<binary> --help-config` lists them all).

# ---------------------------------------------------------------- build stage
FROM debian:12 AS build
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config ca-certificates \
      librdkafka-dev libhiredis-dev libcurl4-openssl-dev libpq-dev libssl-dev \
      libmsgpack-dev libjansson-dev libmicrohttpd-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Tests (cmocka, fuzzers) are built and run by CI on the host, not in the image.
ARG CMAKE_BUILD_TYPE=Release
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE}" -DSL_TESTS=OFF \
 && cmake --build /build -j"$(nproc)" \
 && cmake --install /build --prefix /opt/sluice --strip \
 && ls -l /opt/sluice/bin

# ---------------------------------------------------------------- runtime stage
FROM debian:12-slim
ARG DEBIAN_FRONTEND=noninteractive
# Runtime halves of the -dev packages above (Debian 12 sonames).
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      ca-certificates librdkafka1 libhiredis0.14 libcurl4 libpq5 libssl3 \
      libmsgpackc2 libjansson4 libmicrohttpd12 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --user-group --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin sluice
COPY --from=build /opt/sluice/ /usr/local/
USER sluice
# Defaults match compose.yaml's service names; override with -e / environment:.
ENV SLUICE_KAFKA_BROKERS=kafka:29092 \
    SLUICE_REDIS_URL=redis://redis:6379 \
    SLUICE_PG_DSN="host=postgres port=5432 dbname=sluice user=sluice"
# The consumer drains in-flight requests on SIGTERM (shutdown_drain_ms, default 10 s).
STOPSIGNAL SIGTERM
CMD ["sluice-consumer"]
