# dwara's container image: one static binary, nothing else.
#
# Build it with `cargo xtask image`, which compiles the binary statically
# (RUSTFLAGS="-C target-feature=+crt-static", target x86_64-unknown-linux-gnu) and
# runs `docker build -f Dockerfile target/image` with that binary as the only file
# of the build context. No registry is needed: `FROM scratch` pulls nothing.
FROM scratch
COPY dwara /dwara
# DNS (UDP and TCP), the HTTP API, gossip.
EXPOSE 53/udp 53/tcp 6784/tcp 6783/udp
# Registrations made over HTTP survive a restart when /data is a volume.
VOLUME /data
ENTRYPOINT ["/dwara"]
# Docker's own events name the containers; the socket must be mounted
# (-v /var/run/docker.sock:/var/run/docker.sock), or `serve` exits with one line.
# The HTTP API stays on the container's loopback unless --http-listen says otherwise.
CMD ["serve", "--dns-listen", "0.0.0.0:53", "--http-listen", "127.0.0.1:6784", "--docker", "on", "--data-dir", "/data"]
