//! TTL-aware A/AAAA/SRV resolution over hickory's TokioResolver.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
