//! The health of an entry, and the rule that decides which entries are answered.
//!
//! An entry without a check is [`Health::Unchecked`] and always answered. One whose
//! owner checks it (a Docker `HEALTHCHECK`, or `check=tcp` on an HTTP registration)
//! is answered while [`Health::Healthy`]; [`Health::Starting`] (no verdict yet) and
//! [`Health::Unhealthy`] are not. When no live entry of a name passes, the name
//! *fails open* (its unhealthy entries are answered, as if unchecked; starting ones
//! still are not: they have no verdict yet) unless the database is configured
//! otherwise: a name that disappears because its checks fail is worse than one that
//! answers addresses that may not work. Envoy's health checking and Consul's
//! `only_passing` do not fail open.
//!
//! Health is a property of the entry, set by its owner: a change bumps the entry's
//! version and is replicated like any other change, so every node answers alike.

use serde::{Deserialize, Serialize};

/// What the owner's check says of an entry.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Health {
    /// No check: always answered.
    #[default]
    Unchecked,
    /// Checked, no verdict yet (Docker's `starting`): not answered yet.
    Starting,
    /// The check passes: answered.
    Healthy,
    /// The check fails: not answered (unless the whole name fails open).
    Unhealthy,
}

impl Health {
    /// Every state, in the order metrics list them.
    pub const ALL: [Health; 4] = [
        Health::Unchecked,
        Health::Starting,
        Health::Healthy,
        Health::Unhealthy,
    ];

    /// Whether an entry in this state is answered on its own.
    pub fn passing(self) -> bool {
        matches!(self, Health::Unchecked | Health::Healthy)
    }

    /// The state's name, as in JSON and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Unchecked => "unchecked",
            Health::Starting => "starting",
            Health::Healthy => "healthy",
            Health::Unhealthy => "unhealthy",
        }
    }

    /// Whether this is [`Health::Unchecked`] (JSON leaves it out).
    pub fn is_unchecked(&self) -> bool {
        *self == Health::Unchecked
    }

    /// The state from its wire code (see [`Health::code`]); `None` for unknown codes.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(usize::from(code)).copied()
    }

    /// A small number for compact encodings: the position in [`Health::ALL`].
    pub fn code(self) -> u8 {
        match self {
            Health::Unchecked => 0,
            Health::Starting => 1,
            Health::Healthy => 2,
            Health::Unhealthy => 3,
        }
    }
}

impl std::fmt::Display for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether a name whose live entries all fail their checks answers them all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HealthFailMode {
    /// Answer the unhealthy entries when none passes (the default).
    #[default]
    Open,
    /// Answer only passing entries, none when none passes.
    Closed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_only_unchecked_and_healthy_pass() {
        for h in Health::ALL {
            assert_eq!(Health::from_code(h.code()), Some(h));
        }
        assert_eq!(Health::from_code(4), None);
        let passing: Vec<_> = Health::ALL.into_iter().filter(|h| h.passing()).collect();
        assert_eq!(passing, [Health::Unchecked, Health::Healthy]);
    }
}
