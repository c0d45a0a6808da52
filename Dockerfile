# syntax=docker/dockerfile:1
# mmrouter image: one static-ish binary on Debian slim.
#   docker build -t mmrouter .
#   docker run --rm -p 8080:8080 -v "$PWD/my.toml:/etc/mmrouter/mmrouter.toml:ro" mmrouter
# The same image runs the simulated workers: `docker run mmrouter sim --host 0.0.0.0 --port 8000 ...`.

FROM rust:1.95-bookworm AS builder
WORKDIR /src

# Dependencies first: build them against stub sources so this layer survives edits to src/.
# Cargo refuses a manifest whose declared [[bench]]/[[test]]/[[example]] files are missing, so each
# one gets a stub too (they are not compiled by `cargo build`).
COPY Cargo.toml Cargo.lock ./
RUN <<'EOF'
set -eu
mkdir -p src
echo 'fn main() {}' > src/main.rs
: > src/lib.rs
awk -F'"' '
    function flush() {
        if (kind != "" && name != "") print (path != "" ? path : dir[kind] "/" name ".rs")
        kind = ""; name = ""; path = ""
    }
    BEGIN { dir["bench"] = "benches"; dir["test"] = "tests"; dir["example"] = "examples" }
    /^[ \t]*\[/ { flush() }
    /^[ \t]*\[\[bench\]\]/ { kind = "bench"; next }
    /^[ \t]*\[\[test\]\]/ { kind = "test"; next }
    /^[ \t]*\[\[example\]\]/ { kind = "example"; next }
    kind != "" && /^[ \t]*name[ \t]*=/ { name = $2 }
    kind != "" && /^[ \t]*path[ \t]*=/ { path = $2 }
    END { flush() }
' Cargo.toml | while read -r f; do
    mkdir -p "$(dirname "$f")"
    [ -e "$f" ] || echo 'fn main() {}' > "$f"
done
cargo build --release --locked
# Forget the stub crate so the real sources are always rebuilt, whatever their mtimes.
rm -rf src target/release/.fingerprint/mmrouter-*
EOF

# config/ is needed at build time: the bundled model profiles are embedded in the binary.
COPY src src
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
