//! The library side of the `dwara` binary: what is worth testing and fuzzing on its
//! own, without a process around it.
//!
//! - [`config`]: the YAML configuration file, strict parsing and key-path errors.
//! - [`auth`]: the HTTP API's bearer token (`--http-token-file`): the token file,
//!   the `Authorization` header and the middleware that answers 401.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod config;
