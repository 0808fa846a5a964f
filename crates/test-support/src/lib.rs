//! Test support: an in-process controllable DNS server and helpers.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
