//! The DiscoverySource trait, discovery config and the DiscoveryTasks lifecycle.

#![forbid(unsafe_code)]
#![warn(missing_docs)]
