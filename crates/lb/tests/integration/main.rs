//! Integration tests of `dwara-lb` through its public API: property tests and the
//! threaded swap test.

mod properties;
mod swap;
