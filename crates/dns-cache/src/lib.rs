//! moka-backed TTL DNS cache for the connection dial path.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
