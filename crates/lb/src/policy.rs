//! The load-balancing policy names, as they appear in config files and on the command line.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;

/// Which endpoint [`UpstreamLb::pick`](crate::UpstreamLb::pick) returns.
///
/// Config and CLI names: `round_robin`, `random`, `p2c`, `srv`, `consistent_hash`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Round robin; smooth weighted round robin (nginx) when weights differ.
    #[default]
    RoundRobin,
    /// Uniform random; weighted random when weights differ.
    Random,
    /// Power of two choices: two random endpoints, the one with fewer requests in
    /// flight (relative to its weight) wins.
    P2c,
    /// RFC 2782: the lowest priority group that has endpoints, weighted within it.
    Srv,
    /// Consistent hashing (a Ketama-style ring) of the key given to
    /// [`UpstreamLb::pick_by_key`](crate::UpstreamLb::pick_by_key).
    ConsistentHash,
}

impl Policy {
    /// Every policy, in declaration order.
    pub const ALL: [Policy; 5] = [
        Policy::RoundRobin,
        Policy::Random,
        Policy::P2c,
        Policy::Srv,
        Policy::ConsistentHash,
    ];

    /// The config name (`round_robin`, `random`, `p2c`, `srv`, `consistent_hash`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round_robin",
            Policy::Random => "random",
            Policy::P2c => "p2c",
            Policy::Srv => "srv",
            Policy::ConsistentHash => "consistent_hash",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Policy {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| Error::UnknownPolicy(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);
        }
        assert_eq!(Policy::default(), Policy::RoundRobin);
        let yaml = "- round_robin\n- random\n- p2c\n- srv\n- consistent_hash\n";
        let parsed: Vec<Policy> = serde_yaml_ng::from_str(yaml).unwrap();
        assert_eq!(parsed, Policy::ALL);
        assert_eq!(
            serde_yaml_ng::to_string(&Policy::P2c).unwrap().trim(),
            "p2c"
        );
        assert!(serde_yaml_ng::from_str::<Policy>("RoundRobin").is_err());
        let err = "least_conn".parse::<Policy>().unwrap_err();
        assert!(err.to_string().contains("least_conn"), "{err}");
    }
}
