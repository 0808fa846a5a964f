//! The service and port an entry may carry, answered as SRV records.
//!
//! An entry registered with a [`ServicePort`] (say `_http._tcp`, port 80) under
//! `web.weave.local.` makes the name server answer `SRV` for
//! `_http._tcp.web.weave.local.`: one record per instance (address and port), with
//! the entry's priority and weight (0 and 1 unless the registration set them), that
//! port, and the target `<hex address>.addr.<domain>` (`0a200007.addr.weave.local.`
//! for 10.32.0.7), a name of the instance's own that answers A or AAAA with its one
//! address; those address records go in the additional section.
//!
//! Two entries offering one service at one address and port are one SRV record,
//! with the priority and weight of the first registered.
//!
//! Priority and weight are RFC 2782's: 0–65535 each, a client uses the instances
//! of the lowest priority it can reach and spreads over them in proportion to
//! their weights. Weight 0 is allowed, as RFC 2782 allows it: such an instance
//! gets a very small share while others of its priority have a weight above 0 (see
//! the RFC's selection rule), and an even share among weight-0 instances alone.
//!
//! A service is two labels, RFC 2782 and RFC 6335 style: `_name._tcp` or `_name._udp`,
//! where `name` is 1 to 15 letters, digits and hyphens (not starting or ending with a
//! hyphen). It is kept lower-case, without a trailing dot.

use std::fmt;
use std::num::NonZeroU16;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Longest service name label (RFC 6335 §5.1), without the underscore.
pub const MAX_SERVICE_NAME: usize = 15;

/// The priority of an SRV record when the registration does not set one.
pub const DEFAULT_PRIORITY: u16 = 0;
/// The weight of an SRV record when the registration does not set one.
pub const DEFAULT_WEIGHT: u16 = 1;

/// The service an entry offers, its port, and the priority and weight of its SRV
/// record: answered as SRV at `<service>.<fqdn>`.
///
/// ```
/// use dwara_records::ServicePort;
///
/// let s = ServicePort::parse("_HTTP._tcp", "80").unwrap();
/// assert_eq!((s.service(), s.port()), ("_http._tcp", 80));
/// assert_eq!((s.priority(), s.weight()), (0, 1));
/// let heavy = s.with_priority(1).with_weight(9);
/// assert_eq!((heavy.priority(), heavy.weight()), (1, 9));
/// assert!(ServicePort::parse("http", "80").is_err());
/// assert!(ServicePort::parse("_http._tcp", "0").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "RawServicePort", into = "RawServicePort")]
pub struct ServicePort {
    service: String,
    port: NonZeroU16,
    priority: u16,
    weight: u16,
}

/// The serde form: `{"service": "_http._tcp", "port": 80, "priority": 0,
/// "weight": 1}` (flattened into an entry); priority and weight may be absent
/// (what builds before them wrote), meaning 0 and 1.
#[derive(Serialize, Deserialize)]
struct RawServicePort {
    service: String,
    port: u16,
    #[serde(default)]
    priority: Option<u16>,
    #[serde(default)]
    weight: Option<u16>,
}

impl TryFrom<RawServicePort> for ServicePort {
    type Error = Error;

    fn try_from(raw: RawServicePort) -> Result<Self> {
        let port = NonZeroU16::new(raw.port).ok_or(Error::InvalidPort {
            input: raw.port.to_string(),
        })?;
        Ok(Self::new(&raw.service, port)?
            .with_priority(raw.priority.unwrap_or(DEFAULT_PRIORITY))
            .with_weight(raw.weight.unwrap_or(DEFAULT_WEIGHT)))
    }
}

impl From<ServicePort> for RawServicePort {
    fn from(s: ServicePort) -> Self {
        Self {
            service: s.service,
            port: s.port.get(),
            priority: Some(s.priority),
            weight: Some(s.weight),
        }
    }
}

impl ServicePort {
    /// Checks and normalises (lower-cases) `service`; see the module docs for the form.
    pub fn new(service: &str, port: NonZeroU16) -> Result<Self> {
        let bad = |reason: &str| Error::InvalidService {
            input: service.to_owned(),
            reason: reason.to_owned(),
        };
        let lower = service.to_ascii_lowercase();
        let Some((name, proto)) = lower.split_once('.') else {
            return Err(bad("want two labels, _name._tcp or _name._udp"));
        };
        let Some(name) = name.strip_prefix('_') else {
            return Err(bad("the service name must start with an underscore"));
        };
        if name.is_empty() || name.len() > MAX_SERVICE_NAME {
            return Err(bad("the service name must be 1 to 15 characters"));
        }
        if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Err(bad(
                "the service name may hold only letters, digits and hyphens",
            ));
        }
        if name.starts_with('-') || name.ends_with('-') {
            return Err(bad("the service name must not start or end with a hyphen"));
        }
        if proto != "_tcp" && proto != "_udp" {
            return Err(bad("the protocol label must be _tcp or _udp"));
        }
        Ok(Self {
            service: lower,
            port,
            priority: DEFAULT_PRIORITY,
            weight: DEFAULT_WEIGHT,
        })
    }

    /// Parses the form values of the HTTP API: a service and a port (1–65535).
    pub fn parse(service: &str, port: &str) -> Result<Self> {
        let port = parse_port(port)?;
        Self::new(service.trim(), port)
    }

    /// The default service of a port when none is named: `_<port>._<protocol>`
    /// (e.g. `_80._tcp`), so a port alone is still answered as SRV.
    pub fn unnamed(port: NonZeroU16, protocol: Protocol) -> Self {
        Self {
            service: format!("_{port}.{}", protocol.label()),
            port,
            priority: DEFAULT_PRIORITY,
            weight: DEFAULT_WEIGHT,
        }
    }

    /// The same service with the SRV priority `priority` (lower is preferred).
    #[must_use]
    pub fn with_priority(self, priority: u16) -> Self {
        Self { priority, ..self }
    }

    /// The same service with the SRV weight `weight` (the share among instances of
    /// one priority; 0 allowed, see the module docs).
    #[must_use]
    pub fn with_weight(self, weight: u16) -> Self {
        Self { weight, ..self }
    }

    /// The service, lower-case (`_http._tcp`).
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port.get()
    }

    /// The SRV priority (0 unless set).
    pub fn priority(&self) -> u16 {
        self.priority
    }

    /// The SRV weight (1 unless set).
    pub fn weight(&self) -> u16 {
        self.weight
    }

    /// Whether priority and weight are the defaults, 0 and 1 (what builds before
    /// them answered): stores and peers then keep the older, shorter form.
    pub fn has_default_rank(&self) -> bool {
        self.priority == DEFAULT_PRIORITY && self.weight == DEFAULT_WEIGHT
    }

    /// The service's two labels in wire form (`\x05_http\x04_tcp`, no root label).
    pub fn wire_labels(&self) -> Box<[u8]> {
        let mut out = Vec::with_capacity(self.service.len() + 1);
        for label in self.service.split('.') {
            // Checked in `new`: two labels of at most 16 bytes.
            out.push(label.len() as u8);
            out.extend_from_slice(label.as_bytes());
        }
        out.into_boxed_slice()
    }
}

impl fmt::Display for ServicePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} port {}", self.service, self.port)?;
        if !self.has_default_rank() {
            write!(f, " priority {} weight {}", self.priority, self.weight)?;
        }
        Ok(())
    }
}

/// The transport of an unnamed service ([`ServicePort::unnamed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `_tcp`.
    Tcp,
    /// `_udp`.
    Udp,
}

impl Protocol {
    fn label(self) -> &'static str {
        match self {
            Self::Tcp => "_tcp",
            Self::Udp => "_udp",
        }
    }
}

/// Parses a port, 1–65535.
pub fn parse_port(input: &str) -> Result<NonZeroU16> {
    input
        .trim()
        .parse::<NonZeroU16>()
        .map_err(|_| Error::InvalidPort {
            input: input.to_owned(),
        })
}

/// Parses an SRV priority, 0–65535 (RFC 2782's 16-bit field).
pub fn parse_priority(input: &str) -> Result<u16> {
    input
        .trim()
        .parse::<u16>()
        .map_err(|_| Error::InvalidPriority {
            input: input.to_owned(),
        })
}

/// Parses an SRV weight, 0–65535 (RFC 2782's 16-bit field; 0 allowed).
pub fn parse_weight(input: &str) -> Result<u16> {
    input
        .trim()
        .parse::<u16>()
        .map_err(|_| Error::InvalidWeight {
            input: input.to_owned(),
        })
}

/// The priority and weight a registration gave as text, with the defaults (0 and
/// 1) for those it did not give.
pub fn parse_rank(priority: Option<&str>, weight: Option<&str>) -> Result<(u16, u16)> {
    Ok((
        priority
            .map(parse_priority)
            .transpose()?
            .unwrap_or(DEFAULT_PRIORITY),
        weight
            .map(parse_weight)
            .transpose()?
            .unwrap_or(DEFAULT_WEIGHT),
    ))
}

/// Checks a registration without a port: a service, priority or weight needs one
/// (the first of them given is named in the error); none of them is fine.
pub fn check_portless(
    service: Option<&str>,
    priority: Option<&str>,
    weight: Option<&str>,
) -> Result<()> {
    let without = |field, value: &str| Error::RankWithoutPort {
        field,
        value: value.to_owned(),
    };
    match (service, priority, weight) {
        (None, None, None) => Ok(()),
        (Some(service), _, _) => Err(Error::ServiceWithoutPort {
            service: service.to_owned(),
        }),
        (None, Some(v), _) => Err(without("priority", v)),
        (None, None, Some(v)) => Err(without("weight", v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_are_checked_and_folded() {
        let p = NonZeroU16::new(80).unwrap();
        let s = ServicePort::new("_Http._TCP", p).unwrap();
        assert_eq!(s.service(), "_http._tcp");
        assert_eq!(&*s.wire_labels(), b"\x05_http\x04_tcp");
        assert!(ServicePort::new("_dns-sd._udp", p).is_ok());
        assert!(ServicePort::new("_80._tcp", p).is_ok());
        for bad in [
            "",
            "_http",
            "http._tcp",
            "_._tcp",
            "_http._sctp",
            "_http._tcp.",
            "_http._tcp.x",
            "_-http._tcp",
            "_http-._tcp",
            "_ht tp._tcp",
            "_sixteen-chars-xx._tcp",
            "_ünï._tcp",
        ] {
            assert!(
                matches!(ServicePort::new(bad, p), Err(Error::InvalidService { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn ports_are_1_to_65535() {
        assert_eq!(parse_port("80").unwrap().get(), 80);
        assert_eq!(parse_port(" 65535 ").unwrap().get(), 65535);
        for bad in ["0", "65536", "-1", "", "http", "8o"] {
            assert!(
                matches!(parse_port(bad), Err(Error::InvalidPort { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn unnamed_services_carry_port_and_transport() {
        let s = ServicePort::unnamed(NonZeroU16::new(53).unwrap(), Protocol::Udp);
        assert_eq!(s.service(), "_53._udp");
        assert_eq!(
            ServicePort::new(s.service(), NonZeroU16::MIN)
                .unwrap()
                .service(),
            "_53._udp"
        );
    }

    #[test]
    fn priorities_and_weights_are_0_to_65535() {
        assert_eq!(parse_priority("0").unwrap(), 0);
        assert_eq!(parse_priority(" 65535 ").unwrap(), 65535);
        assert_eq!(parse_weight("0").unwrap(), 0);
        assert_eq!(parse_weight("9").unwrap(), 9);
        for bad in ["65536", "-1", "", "x", "1.5", "0x10"] {
            let e = parse_priority(bad).unwrap_err().to_string();
            assert!(e.contains("priority") && e.contains(bad), "{e}");
            let e = parse_weight(bad).unwrap_err().to_string();
            assert!(e.contains("weight") && e.contains(bad), "{e}");
        }
        let s = ServicePort::parse("_http._tcp", "80").unwrap();
        assert!(s.has_default_rank());
        assert_eq!(s.to_string(), "_http._tcp port 80");
        let ranked = s.clone().with_priority(2).with_weight(0);
        assert!(!ranked.has_default_rank());
        assert_ne!(ranked, s);
        assert_eq!(ranked.to_string(), "_http._tcp port 80 priority 2 weight 0");
    }

    #[test]
    fn serde_form_is_checked() {
        // What builds before priority and weight wrote: the defaults.
        let s: ServicePort =
            serde_json::from_str(r#"{"service":"_http._tcp","port":8080}"#).unwrap();
        assert_eq!((s.port(), s.priority(), s.weight()), (8080, 0, 1));
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"service":"_http._tcp","port":8080,"priority":0,"weight":1}"#
        );
        let w: ServicePort =
            serde_json::from_str(r#"{"service":"_http._tcp","port":8080,"priority":3,"weight":9}"#)
                .unwrap();
        assert_eq!(w, s.with_priority(3).with_weight(9));
        assert!(
            serde_json::from_str::<ServicePort>(
                r#"{"service":"_http._tcp","port":80,"weight":65536}"#
            )
            .is_err()
        );
        assert!(
            serde_json::from_str::<ServicePort>(r#"{"service":"_http._tcp","port":0}"#).is_err()
        );
        assert!(serde_json::from_str::<ServicePort>(r#"{"service":"http","port":80}"#).is_err());
    }
}
