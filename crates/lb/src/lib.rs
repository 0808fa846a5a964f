//! Endpoint sets and load-balancing policies with atomic live updates.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
