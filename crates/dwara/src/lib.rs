//! The library side of the `dwara` binary: what is worth testing and fuzzing on its
//! own, without a process around it.
//!
//! - [`config`]: the YAML configuration file, strict parsing and key-path errors.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
