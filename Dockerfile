# Multi-stage build: compile in the Rust image, run in a slim non-root image.
#
#   docker build --build-arg PRONTO_GIT_REVISION=$(git rev-parse --short=12 HEAD) -t pronto:0.1.0 .
#   docker run -p 8080:8080 -p 9400:9400 -e PRONTO_ADMIN_TOKEN=$(openssl rand -hex 32) pronto:0.1.0
#
# The image's config is config/docker.yaml (plain HTTP on 0.0.0.0:8080, no API keys, the admin
# listener on 0.0.0.0:9400 behind $PRONTO_ADMIN_TOKEN, one DNS-discovered pool `vllm:8000`);
# mount your own over /etc/pronto/pronto.yaml. tests/container.rs runs this file's ENTRYPOINT
# and CMD against that config.
FROM rust:1-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
COPY examples ./examples
# build.rs reads config/ (the example secrets the binary refuses).
COPY config ./config
# The build context has no .git: build.rs takes the revision from here (else `unknown`).
ARG PRONTO_GIT_REVISION=unknown
ENV PRONTO_GIT_REVISION=${PRONTO_GIT_REVISION}
# The gateway alone: the simulator and bench tools (the `tools` feature) stay out of the image;
# the `gateway` profile is the release profile (stripped) with its own output directory.
RUN cargo build --profile gateway --locked --bin pronto --no-default-features

FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin pronto
COPY --from=build /src/target/gateway/pronto /usr/local/bin/pronto
# Only the minimal config: no example keys, tokens or TLS key in the image.
COPY config/docker.yaml /etc/pronto/pronto.yaml
USER 10001
EXPOSE 8080 9400
ENTRYPOINT ["/usr/local/bin/pronto"]
CMD ["serve", "--config", "/etc/pronto/pronto.yaml"]
