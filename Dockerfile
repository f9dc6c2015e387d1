# Multi-stage build: compile in the Rust image, run in a slim non-root image.
FROM rust:1-bookworm AS build
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends cmake && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
COPY examples ./examples
COPY config ./config
# The gateway alone: the simulator and bench tools (the `tools` feature) stay out of the image.
RUN cargo build --release --locked --bin pronto --no-default-features && strip target/release/pronto

FROM debian:bookworm-slim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin pronto
COPY --from=build /src/target/release/pronto /usr/local/bin/pronto
# The annotated example refers to files beside it (keys/, tls/): copy the whole directory.
# Mount your own config over /etc/pronto (the example's TLS key is public: never serve with it).
COPY config /etc/pronto
USER 10001
EXPOSE 8080 9400
ENTRYPOINT ["/usr/local/bin/pronto"]
# The file binds loopback; inside a container the client listener must face the network.
CMD ["serve", "--config", "/etc/pronto/pronto.yaml", "--listen", "0.0.0.0:8080"]
