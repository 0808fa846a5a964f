//! WeaveDNS-style name server: records database, DNS handler, fallback forwarder, HTTP API.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
