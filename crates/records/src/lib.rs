#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod answers;
mod db;
mod error;
mod health;
mod name;
mod service;

pub use db::{Change, ChangeKind, DEFAULT_ORIGIN, Db, DbConfig, Entry, Inconsistency, SrvEndpoint};
pub use error::{Error, Result};
pub use health::{Health, HealthFailMode};
pub use name::{Domain, parse_name, reverse_name, wire_lower};
pub use service::{
    DEFAULT_PRIORITY, DEFAULT_WEIGHT, MAX_SERVICE_NAME, Protocol, ServicePort, check_portless,
    parse_port, parse_priority, parse_rank, parse_weight,
};
