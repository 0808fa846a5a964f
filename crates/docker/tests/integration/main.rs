//! Integration tests of the Docker updater against the real Docker engine on this
//! machine (skipped, with a printed reason, only when no engine is reachable).
//!
//! Each test names its containers with its own prefix and removes them on the way
//! out, failed or not. The tiny image (`FROM scratch` + Debian's busybox-static) is
//! built locally once; busybox-static is installed with apt-get when missing and the
//! tests run as root.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

mod lifecycle;
mod measure;
mod reconnect;
mod support;
