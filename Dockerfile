# syntax=docker/dockerfile:1
# mmrouter image: one binary on Debian slim.
#   docker build -t mmrouter --build-arg MMROUTER_GIT_COMMIT=$(git rev-parse --short=12 HEAD) .
#   docker run --rm -p 8080:8080 mmrouter serve --model-dir qwen3-vl --worker http://10.0.0.7:8000 --listen 0.0.0.0:8080
#   docker run --rm -p 8080:8080 -v "$PWD/my.toml:/etc/mmrouter/mmrouter.toml:ro" mmrouter
# The same image runs the simulated workers: `docker run mmrouter sim --host 0.0.0.0 --port 8000 ...`.
# No Docker daemon runs where the tests do: tests/behaviour/packaging.rs runs this file's Rust stages
# with cargo's builds replaced by a check that cargo accepts the workspace at that point.

# The dependency stage's input, derived from the workspace as cargo itself reads it (no list of members
# here to fall behind): every member's manifest and a stub for each of its targets. It changes only
# when a manifest or a target does, so the dependency layer below survives edits to the code.
FROM rust:1.95-bookworm AS skeleton
WORKDIR /src
COPY . .
RUN <<'EOF'
set -eu
mkdir -p skeleton
cp Cargo.toml Cargo.lock skeleton/
cargo metadata --no-deps --offline --format-version 1 | perl -MJSON::PP -e '
    use strict;
    use File::Basename qw(dirname);
    use File::Copy qw(copy);
    use File::Path qw(make_path);
    use Cwd qw(getcwd);
    my $root = getcwd() . "/";
    my $meta = decode_json(join "", <STDIN>);
    sub rel { my $p = shift; index($p, $root) == 0 or die "$p is outside $root\n"; substr($p, length $root) }
    open my $names, ">", "skeleton/.skeleton-packages" or die $!;
    for my $pkg (@{$meta->{packages}}) {
        print $names "$pkg->{name}\n";
        my $manifest = rel($pkg->{manifest_path});
        make_path(dirname("skeleton/$manifest"));
        copy($manifest, "skeleton/$manifest") or die "$manifest: $!\n";
        for my $target (@{$pkg->{targets}}) {
            my $file = "skeleton/" . rel($target->{src_path});
            my $lib = grep { /lib|proc-macro/ } @{$target->{kind}};
            make_path(dirname($file));
            open my $out, ">", $file or die "$file: $!\n";
            print $out ($lib ? "" : "fn main() {}\n");
        }
    }'
# The members as the repository knows them today (tests/behaviour/packaging.rs holds this line to
# Cargo.toml's [workspace] members): a derivation that missed one fails here, not in a later stage.
for member in crates/core crates/kv-events crates/sim crates/loadgen crates/tokenize; do
    test -f "skeleton/$member/Cargo.toml" || { echo "workspace member $member is not in the skeleton" >&2; exit 1; }
done
EOF

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY --from=skeleton /src/skeleton/ ./
# Then forget the stub crates' builds so the real sources are always rebuilt, whatever their mtimes.
RUN cargo build --release --locked -p mmrouter \
    && while read -r pkg; do rm -rf target/release/.fingerprint/"$pkg"-*; done < .skeleton-packages
# Everything the build reads (build.rs, config/'s bundled model profiles, each crate): .dockerignore
# keeps out what it does not.
COPY . .
# For `mmrouter --version`: .git is not in the build context.
ARG MMROUTER_GIT_COMMIT=
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
