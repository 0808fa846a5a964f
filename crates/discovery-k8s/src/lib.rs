//! Kubernetes EndpointSlice discovery source (typed stub: fails at validation).

#![forbid(unsafe_code)]
#![warn(missing_docs)]
