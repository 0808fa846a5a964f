//! DNS discovery source: the refresh cycle that keeps an UpstreamLb in step with DNS.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
