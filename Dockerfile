# syntax=docker/dockerfile:1
# mmrouter image: one static-ish binary on Debian slim.
#   docker build -t mmrouter .
#   docker run --rm -p 8080:8080 -v "$PWD/my.toml:/etc/mmrouter/mmrouter.toml:ro" mmrouter
# The same image runs the simulated workers: `docker run mmrouter sim --host 0.0.0.0 --port 8000 ...`.

FROM rust:1.95-bookworm AS builder
WORKDIR /src

# Dependencies first: build them against stub sources so this layer survives edits to the code.
# Cargo refuses a manifest whose declared [[bench]]/[[test]]/[[example]] files are missing, so each
# one gets a stub too (they are not compiled by `cargo build`).
COPY Cargo.toml Cargo.lock ./
COPY crates/core/Cargo.toml crates/core/Cargo.toml
COPY crates/sim/Cargo.toml crates/sim/Cargo.toml
COPY crates/loadgen/Cargo.toml crates/loadgen/Cargo.toml
COPY crates/kv-events/Cargo.toml crates/kv-events/Cargo.toml
COPY crates/tokenize/Cargo.toml crates/tokenize/Cargo.toml
RUN <<'EOF'
set -eu
for dir in . crates/core crates/sim crates/loadgen crates/kv-events crates/tokenize; do
    mkdir -p "$dir/src"
    : > "$dir/src/lib.rs"
    awk -F'"' '
        function flush() {
            if (kind != "" && name != "") print (path != "" ? path : d[kind] "/" name ".rs")
            kind = ""; name = ""; path = ""
        }
        BEGIN { d["bench"] = "benches"; d["test"] = "tests"; d["example"] = "examples" }
        /^[ \t]*\[/ { flush() }
        /^[ \t]*\[\[bench\]\]/ { kind = "bench"; next }
        /^[ \t]*\[\[test\]\]/ { kind = "test"; next }
        /^[ \t]*\[\[example\]\]/ { kind = "example"; next }
        kind != "" && /^[ \t]*name[ \t]*=/ { name = $2 }
        kind != "" && /^[ \t]*path[ \t]*=/ { path = $2 }
        END { flush() }
    ' "$dir/Cargo.toml" | while read -r f; do
        mkdir -p "$dir/$(dirname "$f")"
        [ -e "$dir/$f" ] || echo 'fn main() {}' > "$dir/$f"
    done
done
echo 'fn main() {}' > src/main.rs
cargo build --release --locked -p mmrouter
# Forget the stub crates so the real sources are always rebuilt, whatever their mtimes.
rm -rf src crates target/release/.fingerprint/mmrouter-*
EOF

# config/ is needed at build time: the bundled model profiles are embedded in the binary.
COPY src src
COPY crates crates
COPY config config
RUN cargo build --release --locked --bin mmrouter


FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 mmrouter \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin mmrouter
COPY --from=builder /src/target/release/mmrouter /usr/local/bin/mmrouter
COPY config/ /etc/mmrouter/
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["mmrouter"]
# --listen: the example config listens on 127.0.0.1, unreachable from outside a container.
CMD ["serve", "--config", "/etc/mmrouter/mmrouter.toml", "--listen", "0.0.0.0:8080"]
